"""Fault-tolerant training with torchft on rsdp: a replica group SIGKILLed and healed mid-run.

    python examples/torchft_train.py               # torchft DDP, 3 replica groups x 1 rank
    python examples/torchft_train.py --mode hsdp   # FSDP2 inside, 2 replica groups x 2 ranks
    python examples/torchft_train.py --bench       # step time: vs torchft+gloo, vs plain DDP
    python examples/torchft_train.py --mode hsdp --groups 4 --ranks-per-group 4 \
        --kill-node --netns                        # a whole node lost and healed (root)

One command runs it all on this machine: torchft's lighthouse (in this process), one store per
replica group attempt (hosted here, as torchrun's agent would), and every rank of every replica
group as a subprocess (examples/torchft_worker.py; the cross-replica group is
``torch_rsdp.torchft.ProcessGroupRSDP``). When replica group ``--kill-group`` reaches step
``--kill-at-step``, its rank ``--kill-rank`` is SIGKILLed; like torchrun's agent, the launcher
then stops the group's other ranks and starts the whole group again. The survivors' pending
all-reduce fails within milliseconds (rsdp's failure notice), their step is not committed, the
lighthouse forms a quorum without the lost group and they go on; the restarted group joins a
later quorum, torchft's Manager heals it from a live replica (model and optimizer state over
HTTP), and it continues with the step the others are at. The run ends once ``--steps`` steps
are committed with every replica group in the quorum; then the final weights of every replica
group are compared (max abs difference, must be 0) and the loss curve of each is printed. The
healed group's model and optimizer state right after the heal are compared with the live
groups' at that step (bit for bit), and every group's committed steps must be contiguous.

``--kill-node``: replica groups are nodes. Each group is one emulated node (its ranks share
``RSDP_NODE_ID``: shared memory inside, UCX between groups; ``--netns``: a network namespace per
group, joined by a bridge, each link limited to ``--rate``), and every rank of the victim group
is SIGKILLed at the same instant mid-step, as when a machine goes down. The other groups go on
without a restart; the launcher starts the node's ranks again and they heal as above.

``--bench`` times three setups in one run on the same ranks, a step of each in turn (so that
other load on the machine hits all three alike): plain ``torch.nn.parallel.
DistributedDataParallel`` over rsdp (no fault tolerance), torchft DDP over ProcessGroupRSDP and
torchft DDP over torchft's ProcessGroupGloo; it prints the time per step of each with ratios,
then runs the kill and heal and times the restarted replica from the kill to its first step.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Dict, List, Optional

if "--verbose" not in sys.argv:
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's lighthouse and managers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torchft_worker.py")


@dataclass
class Proc:
    group: int
    rank: int
    attempt: int
    popen: subprocess.Popen
    tail: List[str] = field(default_factory=list)
    done: bool = False  # its "done" event was read
    eof: bool = False  # its output is read to the end
    ready: bool = False  # it built its model and groups


class Job:
    """The lighthouse, the stores and the ranks of one run; events from every rank on a queue."""

    def __init__(self, args, role: str, pg: str, kill: bool, out: str, nodes=None):
        import torch.distributed as dist

        self.args, self.role, self.pg, self.kill, self.out = args, role, pg, kill, out
        # nodes: an open EmulatedNodes (--netns), replica group g in namespace g; the stores
        # and the lighthouse stay here, reached at the address the namespaces route to us
        self.nodes = nodes
        self.host = nodes.store_addr if nodes is not None else "127.0.0.1"
        self.events: "queue.Queue" = queue.Queue()
        self.procs: List[Proc] = []
        self.stores = []  # every store stays alive until the end (a quorum may name one)
        self.control = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False,
                                     timeout=timedelta(seconds=120))
        self.lighthouses = {}
        if role == "ft":
            self.lighthouses[pg] = self._lighthouse()
        elif role == "bench":
            self.lighthouses = {"rsdp": self._lighthouse(), "gloo": self._lighthouse()}
        self.attempts: Dict[int, int] = {}
        self.log: List[dict] = []
        self.steps = args.steps

    def _lighthouse(self):
        from torchft.coordination import LighthouseServer

        return LighthouseServer(bind="[::]:0", min_replicas=1,
                                join_timeout_ms=self.args.join_timeout_ms, quorum_tick_ms=50,
                                heartbeat_timeout_ms=self.args.heartbeat_timeout_ms)

    def _store(self):
        import torch.distributed as dist

        store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False)
        self.stores.append(store)
        return store

    def _lighthouse_addr(self, lh) -> str:
        # address() names this host, which a node's namespace cannot resolve to us
        return f"http://{self.host}:{lh.address().rsplit(':', 1)[1]}"

    def _node_env(self, g: int) -> Dict[str, str]:
        """Replica group g as emulated node g: its ranks share RSDP_NODE_ID (shared memory
        among them, UCX to the other groups), and with --netns they run in namespace g."""
        if not self.args.nodes:
            return {}
        env = {"RSDP_NODE_ID": f"node{g}", "LOCAL_WORLD_SIZE": str(self.args.ranks_per_group)}
        env["UCX_TLS"] = os.environ.get("UCX_TLS", "tcp")  # not UCX's shared memory
        if self.nodes is not None:
            env["TORCHFT_TRAIN_NETNS"] = self.nodes.netns_name(g)
            env["GLOO_SOCKET_IFNAME"] = self.nodes.ifname(g)
            env["UCX_NET_DEVICES"] = os.environ.get("UCX_NET_DEVICES", self.nodes.ifname(g))
        else:
            # the loopback only: UCX would also use other runs' emulated-node bridges, which
            # can vanish under it
            env["UCX_NET_DEVICES"] = os.environ.get("UCX_NET_DEVICES", "lo")
        return env

    def worker_argv(self) -> List[str]:
        a = self.args
        argv = [sys.executable, WORKER, "--json", "--role", self.role, "--mode", a.mode,
                "--pg", self.pg, "--steps", str(self.steps), "--min-replicas", str(a.min_replicas),
                "--timeout", str(a.timeout), "--dim", str(a.dim), "--layers", str(a.layers),
                "--seq", str(a.seq), "--batch", str(a.batch), "--lr", str(a.lr),
                "--out", self.out]
        return argv

    def start_group(self, g: int) -> None:
        """Starts every rank of replica group g, with a fresh store (as torchrun's agent
        would give a restarted group a fresh rendezvous)."""
        attempt = self.attempts.get(g, -1) + 1
        self.attempts[g] = attempt
        ranks = self.args.ranks_per_group
        env0 = dict(os.environ, WORLD_SIZE=str(ranks), MASTER_ADDR=self.host,
                    REPLICA_GROUP_ID=str(g), NUM_REPLICA_GROUPS=str(self.args.groups),
                    TORCHFT_TRAIN_CONTROL=f"{self.host}:{self.control.port}",
                    TORCHFT_TRAIN_ATTEMPT=str(attempt), PYTHONUNBUFFERED="1",
                    **self._node_env(g))
        if self.role == "ft":
            env0["MASTER_PORT"] = str(self._store().port)
            env0["TORCHFT_LIGHTHOUSE"] = self._lighthouse_addr(self.lighthouses[self.pg])
        else:  # bench: a store and a lighthouse per torchft setup, the plain group on ours
            env0["MASTER_PORT"] = str(self.control.port)
            env0["TORCHFT_TRAIN_BENCH"] = json.dumps(
                {"plain_port": self.control.port,
                 **{k: {"lighthouse": self._lighthouse_addr(lh), "port": self._store().port}
                    for k, lh in self.lighthouses.items()}})
        pgid = 0  # the group's ranks share a process group: --kill-node kills it in one call
        for r in range(ranks):
            env = dict(env0, RANK=str(r), LOCAL_RANK=str(r))
            p = subprocess.Popen(self.worker_argv(), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, bufsize=1,
                                 process_group=pgid)
            pgid = pgid or p.pid
            proc = Proc(g, r, attempt, p)
            self.procs.append(proc)
            self.events.put({"ev": "spawned", "group": g, "rank": r, "attempt": attempt,
                             "t": time.time()})
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: Proc) -> None:
        for line in proc.popen.stdout:
            line = line.rstrip("\n")
            if line.startswith("{"):
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    ev = None
                if ev is not None:
                    proc.done = proc.done or ev["ev"] == "done"
                    proc.ready = proc.ready or ev["ev"] == "ready"
                    self.events.put(ev)
                    continue
            proc.tail = (proc.tail + [line])[-40:]
            if self.args.verbose:
                print(f"  [g{proc.group} r{proc.rank} a{proc.attempt}] {line}", flush=True)
        proc.eof = True

    def group_procs(self, g: int, attempt: int) -> List[Proc]:
        return [p for p in self.procs if p.group == g and p.attempt == attempt]

    def run(self, on_event=None) -> List[dict]:
        """Starts every group, kills and restarts as asked, returns every event."""
        a = self.args
        for g in range(a.groups):
            self.start_group(g)
        ranks_total = a.groups * a.ranks_per_group
        go_sent = False
        killed = not self.kill
        kill_at, kill_step, kill_attempt = None, -1, -1
        deadline = time.time() + a.deadline
        while True:
            if not go_sent and self.control.add("ready", 0) >= ranks_total:
                self.control.set("go", "1")
                go_sent = True
            wait = 0.05 if kill_at is None else min(0.05, max(0.0, kill_at - time.time()))
            try:
                ev = self.events.get(timeout=wait) if wait > 0 else self.events.get_nowait()
            except queue.Empty:
                ev = None
            if ev is not None:
                self.log.append(ev)
                if on_event:
                    on_event(ev)
                if (kill_at is None and not killed and ev["ev"] == "step"
                        and ev["group"] == a.kill_group and ev["step"] >= a.kill_at_step
                        and ev["rank"] == a.kill_rank):
                    # mid-step: half a step after this one ended, in the next one's
                    # forward or backward (the survivors then wait on it in an all-reduce)
                    kill_at = time.time() + a.kill_delay * ev["dt"]
                    kill_step = ev["step"] + 1
            if kill_at is not None and time.time() >= kill_at:
                group = self.group_procs(a.kill_group, self.attempts[a.kill_group])
                victim = [p for p in group if p.rank == a.kill_rank][0]
                t = time.time()
                if a.kill_node:
                    # every rank at the same instant, as a node losing power: one signal to
                    # the process group its ranks were started in
                    os.killpg(group[0].popen.pid, signal.SIGKILL)
                    ranks = [p.rank for p in group]
                else:
                    os.kill(victim.popen.pid, signal.SIGKILL)
                    ranks = [a.kill_rank]
                killed, kill_at, kill_attempt = True, None, victim.attempt
                kev = {"ev": "killed", "group": a.kill_group, "rank": a.kill_rank,
                       "ranks": ranks, "attempt": victim.attempt, "step": kill_step, "t": t}
                self.log.append(kev)
                if on_event:
                    on_event(kev)
            # a group with a dead rank: stop its other ranks and start it again (torchrun's
            # agent does the same); a rank that finished cleanly is not restarted
            for g in range(a.groups):
                cur = self.group_procs(g, self.attempts[g])
                failed = [p for p in cur if p.popen.poll() not in (None, 0)
                          or (p.popen.poll() == 0 and p.eof and not p.done)]
                if not failed:
                    continue
                # a rank that fails before it is ready is not a fault to heal from
                if (self.role == "bench" or self.attempts[g] >= a.max_restarts
                        or not all(p.ready for p in failed)):
                    raise RuntimeError(self._failure(failed[0]))
                for p in cur:
                    if p.popen.poll() is None:
                        p.popen.kill()
                for p in cur:
                    p.popen.wait()
                self.log.append({"ev": "group_stopped", "group": g, "t": time.time(),
                                 "codes": [p.popen.returncode for p in cur]})
                if not (g == a.kill_group and killed and self.attempts[g] == kill_attempt):
                    print("replica group %d failed (not killed by us), restarting it: %s"
                          % (g, self._failure(failed[0])), flush=True)
                self.start_group(g)
            if all(p.popen.poll() == 0 and p.eof and p.done for p in self.procs
                   if p.attempt == self.attempts[p.group]):
                # drain what the readers still hold
                while not self.events.empty():
                    self.log.append(self.events.get())
                return self.log
            if time.time() > deadline:
                raise RuntimeError(f"the run did not end within --deadline {a.deadline} s; "
                                   + "; ".join(self._failure(p) for p in self.procs
                                               if p.popen.poll() is None))

    def _failure(self, p: Proc) -> str:
        return (f"replica group {p.group} rank {p.rank} (attempt {p.attempt}) exited with "
                f"{p.popen.poll()}; its last lines:\n  " + "\n  ".join(p.tail[-15:]))

    def close(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
        for lh in self.lighthouses.values():
            lh.shutdown()


# ---- reports ----

def step_time(log: List[dict], warmup: int) -> float:
    """Mean time per step after the warm-up: from the end of step `warmup` to the end of the
    last step, the slowest rank's."""
    per_rank: Dict[tuple, List[tuple]] = {}
    for e in log:
        if e["ev"] == "step" and e["committed"]:
            per_rank.setdefault((e["group"], e["rank"]), []).append((e["step"], e["t"]))
    worst = 0.0
    for steps in per_rank.values():
        steps.sort()
        tail = [s for s in steps if s[0] >= warmup]
        if len(tail) >= 2:
            worst = max(worst, (tail[-1][1] - tail[0][1]) / (tail[-1][0] - tail[0][0]))
    return worst


def loss_curves(log: List[dict]) -> Dict[int, Dict[int, float]]:
    """group -> step -> mean loss over the group's ranks (committed steps only)."""
    acc: Dict[int, Dict[int, List[float]]] = {}
    for e in log:
        if e["ev"] == "step" and e["committed"]:
            acc.setdefault(e["group"], {}).setdefault(e["step"], []).append(e["loss"])
    return {g: {s: sum(v) / len(v) for s, v in sorted(d.items())} for g, d in acc.items()}


def compare_weights(out: str, groups: int, ranks: int) -> float:
    import torch

    worst = 0.0
    for r in range(ranks):
        ref = torch.load(os.path.join(out, f"final_g0_r{r}.pt"))
        for g in range(1, groups):
            other = torch.load(os.path.join(out, f"final_g{g}_r{r}.pt"))
            assert other.keys() == ref.keys()
            for k in ref:
                worst = max(worst, (ref[k].float() - other[k].float()).abs().max().item())
    return worst


def recovery_report(log: List[dict], args) -> dict:
    kill = next(e for e in log if e["ev"] == "killed")
    g = kill["group"]
    t0 = kill["t"]
    # the step it died in: one after the last its group committed (all its ranks vote on a
    # commit, so none commits a step the killed rank did not finish)
    kill["step"] = 1 + max(e["step"] for e in log if e["ev"] == "step" and e["group"] == g
                           and e["attempt"] == kill["attempt"] and e["committed"])
    stopped = next(e for e in log if e["ev"] == "group_stopped" and e["group"] == g)
    new = [e for e in log if e.get("group") == g and e.get("attempt") == kill["attempt"] + 1]
    spawned = min(e["t"] for e in new if e["ev"] == "spawned")
    ready = [e for e in new if e["ev"] == "ready"]
    quorum = [e for e in new if e["ev"] == "quorum"]
    steps = [e for e in new if e["ev"] == "step" and e["committed"]]
    first = min(steps, key=lambda e: e["t"])
    # the survivors: their step in which the kill happened, and their longest step
    surv = [e for e in log if e["ev"] == "step" and e["group"] != g and e["t"] >= t0]
    failed = [e for e in surv if not e["committed"]]
    # their first step committed after the kill, done when its slowest rank is done
    after = [e for e in surv if e["committed"]]
    nxt = min((e["step"] for e in after), default=None)
    rep = {
        "killed_group": g, "killed_rank": None if args.kill_node else kill["rank"],
        "killed_ranks": kill["ranks"], "kill_node": bool(args.kill_node),
        "kill_at_step": kill["step"], "attempt": kill["attempt"],
        "group_stopped_s": stopped["t"] - t0,
        "respawned_s": spawned - t0,
        "imported_s": max(e["t_imported"] for e in ready) - t0,
        "ready_s": max(e["t_ready"] for e in ready) - t0,
        "healed_s": max(e["t"] for e in quorum) - t0,
        "healed_at_step": min(e["step"] for e in quorum),
        "first_step_s": max(e["t"] for e in steps if e["step"] == first["step"]) - t0,
        "first_step": first["step"],
        "survivor_failed_steps": len({(e["group"], e["step"]) for e in failed}),
        "survivor_first_failure_s": (min(e["t"] for e in failed) - t0) if failed else None,
        "survivor_longest_step_s": max((e["dt"] for e in surv), default=0.0),
        "survivor_next_commit_step": nxt,
        "survivor_next_commit_s": (max(e["t"] for e in after if e["step"] == nxt) - t0
                                   if nxt is not None else None),
        # the healed replica's quorum: waiting for it, receiving the live replica's state
        # and loading it (the first zero_grad; the slowest rank's)
        "heal_s": max(e["quorum_s"] for e in quorum),
    }
    rep["relaunch_to_healed_step_s"] = rep["first_step_s"] - rep["respawned_s"]
    return rep


def committed_steps(log: List[dict], groups: int) -> Dict[int, List[int]]:
    """group -> the steps it committed, in order (every rank of a group votes on a commit, so
    rank 0's record stands for the group)."""
    out: Dict[int, List[int]] = {g: [] for g in range(groups)}
    for e in sorted((e for e in log if e["ev"] == "step" and e["committed"] and e["rank"] == 0),
                    key=lambda e: e["t"]):
        out[e["group"]].append(e["step"])
    return out


def runs(steps: List[int]) -> List[List[int]]:
    """[0, 1, 2, 7, 8] -> [[0, 2], [7, 8]]: the contiguous runs of a step sequence."""
    out: List[List[int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


def continuity(log: List[dict], groups: int, final_step: int, rec: Optional[dict]) -> dict:
    """No committed step lost: every group that was never killed committed each of the steps
    0 .. final-1 once, in order; the killed group did so up to the kill and from its healed
    step on."""
    steps = committed_steps(log, groups)
    killed = rec["killed_group"] if rec else None
    survivors_ok = all(steps[g] == list(range(final_step)) for g in steps if g != killed)
    killed_ok = killed is None or steps[killed] == (
        list(range(rec["kill_at_step"])) + list(range(rec["first_step"], final_step)))
    return {"committed_runs": {str(g): runs(v) for g, v in steps.items()},
            "survivors_contiguous": survivors_ok, "killed_group_contiguous": killed_ok,
            "no_step_lost": survivors_ok and killed_ok}


def _tensors(obj, prefix=""):
    """(path, tensor) of every tensor in a nested state dict, and the non-tensor leaves."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _tensors(obj[k], f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}/{i}")
    else:
        yield prefix, obj


def heal_check(out: str, rec: dict, groups: int, ranks: int) -> dict:
    """The healed replica's model and optimizer state right after the heal against every live
    replica's at the same step, rank by rank (under FSDP2 shard by shard): bit for bit."""
    import torch

    g, s, a = rec["killed_group"], rec["healed_at_step"], rec["attempt"] + 1
    res = {"step": s, "against_groups": [], "model_tensors": 0, "optim_tensors": 0,
           "model_equal": True, "optim_equal": True, "max_abs_diff": 0.0}
    for o in range(groups):
        if o == g:
            continue
        for r in range(ranks):
            healed = torch.load(os.path.join(out, f"heal_g{g}_r{r}_a{a}_s{s}.pt"))
            path = os.path.join(out, f"heal_g{o}_r{r}_a0_s{s}.pt")
            if not os.path.exists(path):  # this group was not in the healing quorum
                break
            live = torch.load(path)
            for part in ("model", "optim"):
                x, y = list(_tensors(healed[part])), list(_tensors(live[part]))
                same = [k for k, _ in x] == [k for k, _ in y]
                for (_, u), (_, v) in zip(x, y):
                    if isinstance(u, torch.Tensor):
                        res[f"{part}_tensors"] += 1
                        eq = (isinstance(v, torch.Tensor) and u.dtype == v.dtype
                              and u.shape == v.shape and torch.equal(u, v))
                        if isinstance(v, torch.Tensor) and u.shape == v.shape and u.numel():
                            res["max_abs_diff"] = max(res["max_abs_diff"], (
                                u.double() - v.double()).abs().max().item())
                    else:
                        eq = u == v
                    same = same and eq
                res[f"{part}_equal"] = res[f"{part}_equal"] and same
        else:
            res["against_groups"].append(o)
    res["bitwise_equal"] = bool(res["against_groups"]) and res["model_equal"] \
        and res["optim_equal"]
    return res


def print_curves(curves, groups: int, every: int, kill: Optional[dict]) -> None:
    steps = sorted({s for d in curves.values() for s in d})
    marks = set(range(0, steps[-1] + 1, every)) | {steps[-1]}
    if kill:
        k = kill["kill_at_step"]
        marks |= {k - 1, k, k + 1, kill["first_step"], kill["first_step"] + 1}
    marks &= set(steps)
    print("\nloss per replica group (committed steps; '-': not in the quorum)")
    print("  step " + "".join(f"  group {g:<3}" for g in range(groups)))
    for s in sorted(marks):
        row = "".join(f"  {curves.get(g, {}).get(s, float('nan')):9.4f}"
                      if s in curves.get(g, {}) else "          -" for g in range(groups))
        print(f"  {s:4d} {row}")


def command_line() -> str:
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])]
                                + sys.argv[1:])


def fault_run(args, out: str, quiet: bool = False, nodes=None) -> dict:
    def show(ev):
        if quiet:
            return
        k = ev["ev"]
        if k == "killed":
            who = (f"every rank ({len(ev['ranks'])}) of replica group {ev['group']} (its node)"
                   if args.kill_node else f"replica group {ev['group']} rank {ev['rank']}")
            print(f"SIGKILL {who} during step {ev['step']}", flush=True)
        elif k == "quorum" and ev["attempt"] > 0 and ev["rank"] == 0:
            print(f"replica group {ev['group']} (restarted) joined the quorum at step "
                  f"{ev['step']} with {ev['participants']} replica groups, healed from a live "
                  f"replica", flush=True)
        elif k == "step" and ev["rank"] == 0 and (ev["step"] % args.log_every == 0
                                                  or not ev["committed"]):
            print(f"  replica group {ev['group']} step {ev['step']:4d} loss {ev['loss']:.4f} "
                  f"replicas {ev['participants']}"
                  + ("" if ev["committed"] else "  (not committed: a replica was lost)"),
                  flush=True)

    job = Job(args, "ft", args.pg, kill=args.kill_at_step >= 0, out=out, nodes=nodes)
    try:
        log = job.run(show)
    finally:
        job.close()
    res = {"log": log, "curves": loss_curves(log), "attempts": dict(job.attempts)}
    if args.kill_at_step >= 0:
        res["recovery"] = recovery_report(log, args)
        res["heal_check"] = heal_check(out, res["recovery"], args.groups,
                                       args.ranks_per_group)
    res["max_abs_diff"] = compare_weights(out, args.groups, args.ranks_per_group)
    res["final_step"] = max(e["step"] for e in log if e["ev"] == "done")
    res["continuity"] = continuity(log, args.groups, res["final_step"], res.get("recovery"))
    return res


def print_recovery(rec: dict) -> None:
    who = (f"all {len(rec['killed_ranks'])} ranks, the whole node" if rec["kill_node"]
           else f"rank {rec['killed_rank']}")
    print(f"\nrecovery of replica group {rec['killed_group']} ({who} SIGKILLed during step "
          f"{rec['kill_at_step']}), seconds after the kill:")
    rows = [("the survivors' step ended, not committed", rec["survivor_first_failure_s"]),
            (f"the survivors' next step committed (step {rec['survivor_next_commit_step']})",
             rec["survivor_next_commit_s"]),
            ("the group stopped and started again", rec["respawned_s"]),
            ("its new ranks have imported torch", rec["imported_s"]),
            ("model, Manager and groups built", rec["ready_s"]),
            (f"in the quorum, healed to step {rec['healed_at_step']}", rec["healed_s"]),
            (f"first step done (step {rec['first_step']})", rec["first_step_s"])]
    for label, v in rows:
        print(f"  {label:44s} " + ("-" if v is None else f"{v:7.3f}"))
    print(f"  the survivors' longest step: {rec['survivor_longest_step_s']:.3f} s (the lost "
          f"group is left out of the quorum once its heartbeat times out)")
    print(f"  relaunch to the healed step done: {rec['relaunch_to_healed_step_s']:.3f} s; "
          f"the healing quorum (wait, receive and load the state): {rec['heal_s']:.3f} s")


def print_checks(res: dict) -> None:
    hc, co = res.get("heal_check"), res["continuity"]
    if hc:
        print(f"\nright after healing (step {hc['step']}), against live replica groups "
              f"{hc['against_groups']}: model {hc['model_tensors']} tensors "
              f"{'equal' if hc['model_equal'] else 'DIFFER'}, optimizer {hc['optim_tensors']} "
              f"tensors {'equal' if hc['optim_equal'] else 'DIFFER'} (bit for bit; max abs "
              f"difference {hc['max_abs_diff']:.3g})")
    print("committed steps per replica group: " + "; ".join(
        f"{g}: " + ", ".join(f"{a}-{b}" for a, b in r) for g, r in co["committed_runs"].items())
          + (" (no committed step lost)" if co["no_step_lost"] else " (STEPS LOST)"))


BENCH_NAMES = {"plain": "plain DDP over rsdp (no fault tolerance)",
               "ft-rsdp": "torchft DDP + ProcessGroupRSDP",
               "ft-gloo": "torchft DDP + ProcessGroupGloo"}


def bench(args, out: str) -> dict:
    """One job whose ranks run the three setups a step of each in turn; per setup, the
    slowest rank's time of each step, median (and mean) over the steps after the warm-up."""
    job = Job(args, "bench", "rsdp", kill=False, out=out)
    job.steps = args.bench_steps
    try:
        log = job.run()
    finally:
        job.close()
    per_step: Dict[str, Dict[int, float]] = {}
    for e in log:
        if e["ev"] == "bench_step" and e["step"] >= args.warmup:
            d = per_step.setdefault(e["config"], {})
            d[e["step"]] = max(d.get(e["step"], 0.0), e["dt"])
            assert e["committed"], e
    # where the time goes: per phase, the median over steps of rank 0's
    phases: Dict[str, Dict[str, List[float]]] = {}
    for e in log:
        if e["ev"] == "bench_step" and e["step"] >= args.warmup and e["group"] == 0:
            for ph, v in e["phases"].items():
                phases.setdefault(e["config"], {}).setdefault(ph, []).append(v)
    med = {k: statistics.median(v.values()) for k, v in per_step.items()}
    mean = {k: statistics.fmean(v.values()) for k, v in per_step.items()}
    n = min(len(v) for v in per_step.values())
    print(f"\ntime per step, {args.groups} replica groups x 1 rank, the three setups a step of "
          f"each in turn in the same processes, {n} steps each after {args.warmup} of warm-up "
          f"({command_line()}):")
    print("| setup | median ms/step | mean | vs plain DDP | vs torchft + gloo |")
    print("|---|---|---|---|---|")
    for k in ("plain", "ft-rsdp", "ft-gloo"):
        print(f"| {BENCH_NAMES[k]} | {med[k] * 1000:.1f} | {mean[k] * 1000:.1f} | "
              f"{med[k] / med['plain']:.2f} | {med[k] / med['ft-gloo']:.2f} |")
    names = ("start", "forward", "backward", "allreduce", "step")
    print("\nwhere it goes (replica group 0, median ms; start: zero_grad, with torchft's "
          "quorum; backward: with the all-reduces, which torchft's hook waits for (allreduce: "
          "that wait; plain DDP's overlap the backward); step: with torchft's should_commit):")
    print("| setup | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for k in ("plain", "ft-rsdp", "ft-gloo"):
        print(f"| {BENCH_NAMES[k]} | " + " | ".join(
            f"{statistics.median(phases[k][ph]) * 1000:.1f}" if ph in phases[k] else "-"
            for ph in names) + " |")
    return {"median_ms": {k: v * 1000 for k, v in med.items()},
            "phases_ms": {k: {ph: statistics.median(v) * 1000 for ph, v in d.items()}
                          for k, d in phases.items()},
            "mean_ms": {k: v * 1000 for k, v in mean.items()}, "steps": n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["ddp", "hsdp"], default="ddp")
    p.add_argument("--groups", type=int, default=0,
                   help="replica groups (default: 3 for ddp, 2 for hsdp)")
    p.add_argument("--ranks-per-group", type=int, default=0,
                   help="ranks per replica group (ddp: 1; hsdp default 2)")
    p.add_argument("--pg", choices=["rsdp", "gloo"], default="rsdp")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--kill-group", type=int, default=1)
    p.add_argument("--kill-rank", type=int, default=0)
    p.add_argument("--kill-at-step", type=int, default=15, help="-1: no kill")
    p.add_argument("--kill-node", action="store_true",
                   help="SIGKILL every rank of --kill-group at the same instant, not one "
                        "rank (implies --nodes)")
    p.add_argument("--nodes", action="store_true",
                   help="each replica group is one emulated node: its ranks share "
                        "RSDP_NODE_ID, so they talk through shared memory and to the other "
                        "groups through UCX (over the loopback)")
    p.add_argument("--netns", action="store_true",
                   help="--nodes in network namespaces, one per replica group, joined by a "
                        "bridge, each link limited to --rate (root only)")
    p.add_argument("--rate", default="1gbit", help="--netns: tc rate per link direction")
    p.add_argument("--kill-delay", type=float, default=0.5,
                   help="SIGKILL this many step times after the victim's step --kill-at-step "
                        "ended (0.5: mid-way through the next step)")
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1000,
                   help="the lighthouse's: how soon a silent replica group is dropped")
    p.add_argument("--join-timeout-ms", type=int, default=5000)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--deadline", type=float, default=600.0, help="seconds for one run")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--bench-steps", type=int, default=100,
                   help="--bench: steps of each setup (then the kill and heal run --steps)")
    p.add_argument("--warmup", type=int, default=5, help="--bench: steps not timed")
    p.add_argument("--out", default="", help="directory for weights and summary.json")
    p.add_argument("--verbose", action="store_true", help="the ranks' own output too")
    args = p.parse_args(argv)
    args.groups = args.groups or (3 if args.mode == "ddp" else 2)
    args.ranks_per_group = args.ranks_per_group or (1 if args.mode == "ddp" else 2)
    if args.mode == "ddp" and args.ranks_per_group != 1:
        p.error("--mode ddp: one rank per replica group")
    if args.bench and args.mode != "ddp":
        p.error("--bench compares DDP setups: --mode ddp")
    args.nodes = args.nodes or args.netns or args.kill_node
    if args.bench and args.nodes:
        p.error("--bench runs on one node (no --nodes, --netns, --kill-node)")
    out = args.out or tempfile.mkdtemp(prefix="torchft_train_")
    os.makedirs(out, exist_ok=True)

    summary = {"command": command_line()}
    t_start = time.time()
    if args.bench:
        summary["bench"] = bench(args, tempfile.mkdtemp(dir=out))
        print(f"\nkill and heal ({args.groups} replica groups, torchft + ProcessGroupRSDP):",
              flush=True)
    with contextlib.ExitStack() as stack:
        nodes = None
        if args.netns:
            from torch_rsdp.testing import netns

            netns.cleanup_stale()  # what a SIGKILLed earlier run left behind
            if not netns.namespaces_available():
                p.error("--netns needs root and network namespaces (without it, --nodes "
                        "emulates the nodes by RSDP_NODE_ID on the loopback)")
            nodes = stack.enter_context(netns.EmulatedNodes(args.groups, rate=args.rate))
        summary["nodes"] = (nodes.describe() if nodes is not None else
                            "RSDP_NODE_ID per replica group, UCX over the loopback"
                            if args.nodes else None)
        if summary["nodes"]:
            print(f"replica groups = emulated nodes: {summary['nodes']}", flush=True)
        res = fault_run(args, out, quiet=args.bench, nodes=nodes)
    curves = res["curves"]
    rec = res.get("recovery")
    print_curves(curves, args.groups, args.log_every, rec)
    if rec:
        print_recovery(rec)
        g = rec["killed_group"]
        s = rec["first_step"]
        others = [curves[o][s] for o in curves if o != g and s in curves[o]]
        rec["restarted_first_loss"] = curves[g][s]
        rec["survivors_loss_at_first_step"] = sum(others) / max(len(others), 1)
        rec["initial_loss"] = curves[0][min(curves[0])]
    print_checks(res)
    print(f"\nfinal step {res['final_step']}; weights of the {args.groups} replica groups: "
          f"max abs difference {res['max_abs_diff']:.3g}")
    summary.update({"recovery": rec, "max_abs_diff": res["max_abs_diff"],
                    "heal_check": res.get("heal_check"), "continuity": res["continuity"],
                    "mode": args.mode, "groups": args.groups,
                    "ranks_per_group": args.ranks_per_group,
                    "attempts": res["attempts"], "wall_s": time.time() - t_start,
                    "final_step": res["final_step"],
                    "curves": {str(g): {str(s): v for s, v in d.items()}
                               for g, d in curves.items()}})
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"summary: {os.path.join(out, 'summary.json')}")
    ok = res["max_abs_diff"] == 0.0 and res["continuity"]["no_step_lost"] and all(
        v == v and v < float("inf") for d in curves.values() for v in d.values())
    ok = ok and (not rec or res["heal_check"]["bitwise_equal"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
