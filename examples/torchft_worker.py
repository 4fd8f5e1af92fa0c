"""One rank of one torchft replica group, training a small Llama-like model over rsdp.

Started by examples/torchft_train.py (which runs the lighthouse and every replica group and
kills and restarts one), or by hand, one torchrun per replica group, as torchft's own examples
are run:

    torchft_lighthouse --min_replicas 1 --bind [::]:29510 &
    TORCHFT_LIGHTHOUSE=http://localhost:29510 REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 \\
        torchrun --nproc-per-node 2 --master-port 29600 examples/torchft_worker.py --mode hsdp
    (the same with REPLICA_GROUP_ID=1 and another --master-port, in a second shell)

Modes (``--role ft``, the default):

* ``ddp``: one rank per replica group; ``torchft.DistributedDataParallel`` all-reduces the
  gradients across replica groups through the Manager, over ``ProcessGroupRSDP``
  (``--pg gloo``: torchft's ``ProcessGroupGloo``, for comparison).
* ``hsdp``: several ranks per replica group; FSDP2 ``fully_shard`` over an rsdp group of the
  replica group's ranks shards parameters, gradients and optimizer state inside it, and an
  all-reduce hook averages each reduce-scattered gradient shard across replica groups through
  the Manager (rank r of every replica group forms one ``ProcessGroupRSDP``).

``--role bench`` (the launcher's ``--bench``) times three setups in one process, a step of each
in turn: plain ``torch.nn.parallel.DistributedDataParallel`` over one rsdp group of every
replica group's rank (no fault tolerance), torchft DDP over ProcessGroupRSDP and torchft DDP over
torchft's ProcessGroupGloo.

The Manager heals a (re)started replica group from a live one: its ``state_dict`` callback
serves the model and optimizer state (local shards under FSDP2), the newcomer's
``load_state_dict`` copies them in. Batches depend only on (step, replica group, rank), so a
healed replica continues with the batches the run would have given it.

Environment (torchrun's, plus torchft's): RANK, WORLD_SIZE (ranks of this replica group),
MASTER_ADDR, MASTER_PORT (this replica group's store), TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID,
NUM_REPLICA_GROUPS; RSDP_NODE_ID where the launcher makes each replica group an emulated node.
Set by the launcher only: TORCHFT_TRAIN_CONTROL (host:port of its store, for the start
barrier), TORCHFT_TRAIN_ATTEMPT, TORCHFT_TRAIN_NETNS (``--netns``: the network namespace of
this replica group's node, entered before torch is imported).

With ``--out``, a healed replica and the live ones write their state right after the heal
(``heal_g<group>_r<rank>_a<attempt>_s<step>.pt``), which the launcher compares.
"""
from __future__ import annotations

import time

T_START = time.time()


def _enter_node_namespace() -> None:
    """With the launcher's ``--netns``, move into this replica group's emulated node first,
    while the process has one thread: setns() moves only the calling thread, and torch
    starts threads on import. netns.py is loaded from its file for the same reason (the
    torch_rsdp package imports torch)."""
    import importlib.util
    import os

    name = os.environ.get("TORCHFT_TRAIN_NETNS")
    if not name:
        return
    spec = importlib.util.find_spec("torch_rsdp")  # finds, does not import
    path = os.path.join(os.path.dirname(spec.origin), "testing", "netns.py")
    mod_spec = importlib.util.spec_from_file_location("_torchft_train_netns", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    # the namespace's name is also the host name: torchft's Manager and checkpoint server
    # publish their addresses by host name, which the node's /etc/hosts resolves
    mod.enter(name, hostname=name)


_enter_node_namespace()

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchft  # noqa: E402,F401
import torch_rsdp  # noqa: E402,F401  (registers the "rsdp" backend)

T_IMPORTED = time.time()


# ---- model: a small Llama-like decoder (RMSNorm, RoPE, causal attention, SwiGLU) ----

class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class TinyLlama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, 3 * dim) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freq = 1.0 / (10000 ** (torch.arange(half) / half))
        ang = torch.outer(torch.arange(seq).float(), freq)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        return self.head(self.norm(x))


# ---- data: a fixed sparse "bigram language" (4 likely successors per token) ----

class Language:
    """Every token has 4 successors with probabilities .55/.25/.15/.05: the loss falls from
    ln(vocab) towards the entropy (~1.1 nats) as the model learns the table."""

    def __init__(self, vocab: int, seed: int = 1234):
        g = torch.Generator().manual_seed(seed)
        self.succ = torch.stack([torch.randperm(vocab, generator=g)[:4] for _ in range(vocab)])
        self.prob = torch.tensor([0.55, 0.25, 0.15, 0.05])
        self.vocab = vocab

    def batch(self, step: int, group: int, rank: int, batch: int, seq: int, seed: int = 0):
        g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1009 + group) * 131 + rank)
        tok = torch.empty(batch, seq + 1, dtype=torch.long)
        tok[:, 0] = torch.randint(self.vocab, (batch,), generator=g)
        choice = torch.multinomial(self.prob.expand(batch * seq, 4), 1, generator=g)
        choice = choice.view(batch, seq)
        for t in range(seq):
            tok[:, t + 1] = self.succ[tok[:, t], choice[:, t]]
        return tok[:, :-1], tok[:, 1:]


# ---- state for healing: plain tensors on the wire (local shards under FSDP2) ----

def _local(obj):
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return obj.to_local().detach().clone()
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _local(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_local(v) for v in obj)
    return obj


def _like(value, ref):
    """``value`` (a local tensor) as a tensor of ``ref``'s kind: a DTensor with ref's mesh and
    placements when ref is one (FSDP2's parameters and their optimizer state)."""
    from torch.distributed.tensor import DTensor

    if isinstance(ref, DTensor) and value.dim() > 0:
        return DTensor.from_local(value, ref.device_mesh, ref.placements, run_check=False,
                                  shape=ref.shape, stride=ref.stride())
    return value


def make_state_fns(model: nn.Module, optim: torch.optim.Optimizer):
    params = [p for group in optim.param_groups for p in group["params"]]

    def state_dict():
        return {"model": _local(dict(model.state_dict())), "optim": _local(optim.state_dict())}

    def load_state_dict(sd):
        with torch.no_grad():
            for name, t in model.state_dict().items():
                src = sd["model"][name]
                dst = t.to_local() if hasattr(t, "to_local") else t
                dst.copy_(src)
        osd = sd["optim"]
        osd["state"] = {
            idx: {k: _like(v, params[int(idx)]) for k, v in st.items()}
            for idx, st in osd["state"].items()
        }
        optim.load_state_dict(osd)

    return state_dict, load_state_dict


# ---- the run ----

def emit(args, ev: str, **kw) -> None:
    kw = {"ev": ev, "group": args.group, "rank": args.rank, "attempt": args.attempt, **kw}
    if args.json:
        print(json.dumps(kw), flush=True)
    elif ev == "step":
        print(f"[replica group {kw['group']} rank {kw['rank']}] step {kw['step']:4d} "
              f"loss {kw['loss']:.4f}  replicas {kw['participants']}  "
              f"{'' if kw['committed'] else 'NOT COMMITTED  '}{kw['dt']:.3f} s", flush=True)
    else:
        print(f"[replica group {kw['group']} rank {kw['rank']}] {ev} "
              + " ".join(f"{k}={v}" for k, v in kw.items()
                         if k not in ("ev", "group", "rank", "attempt")), flush=True)


def build(args) -> nn.Module:
    torch.manual_seed(args.seed)
    return TinyLlama(args.vocab, args.dim, args.layers, args.heads, args.seq)


def _barrier_start(args) -> None:
    """All replica groups' first attempts start stepping together (the launcher's barrier), so
    the first quorum has them all; a restarted group joins whatever quorum is running."""
    ctl = os.environ.get("TORCHFT_TRAIN_CONTROL")
    if not ctl or args.attempt > 0:
        return
    host, port = ctl.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    store.add("ready", 1)
    store.wait(["go"])


def _phases(t):
    """Seconds in: zero_grad (torchft: the quorum, and healing) and the batch, forward,
    backward (with the gradient all-reduces), optimizer step (torchft: should_commit)."""
    return dict(zip(("start", "forward", "backward", "step"),
                    (b - a for a, b in zip(t, t[1:]))))


class PlainDDP:
    """Baseline: torch DDP over one rsdp group of every replica group's rank (no torchft)."""

    name = "plain"

    def __init__(self, args, store_port: int):
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        store = dist.TCPStore(host, store_port, is_master=False, wait_for_workers=False)
        dist.init_process_group("rsdp", store=dist.PrefixStore("plain/", store),
                                rank=args.group, world_size=args.groups)
        self.args = args
        self.model = nn.parallel.DistributedDataParallel(build(args))
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        self.lang = Language(args.vocab)
        self.step_no = 0

    def step(self):
        a, t = self.args, [time.perf_counter()]
        self.optim.zero_grad()
        x, y = self.lang.batch(self.step_no, a.group, 0, a.batch, a.seq, a.seed)
        t.append(time.perf_counter())
        loss = F.cross_entropy(self.model(x).flatten(0, 1), y.flatten())
        t.append(time.perf_counter())
        loss.backward()  # the all-reduces overlap it
        t.append(time.perf_counter())
        self.optim.step()
        t.append(time.perf_counter())
        self.step_no += 1
        return self.step_no - 1, loss.item(), True, a.groups, _phases(t)

    def close(self):
        dist.destroy_process_group()


class FTReplica:
    """This rank of a torchft replica group: the model (DDP or FSDP2 inside the group), the
    Manager on the lighthouse at ``lighthouse`` and the store at ``store_port``, the
    cross-replica group (``pg``: "rsdp" or "gloo")."""

    def __init__(self, args, pg_kind: str, lighthouse: str, store_port: int):
        from torchft import Manager
        from torchft.optim import OptimizerWrapper
        from torchft.process_group import ProcessGroupGloo

        # torchft's DistributedDataParallel with a comm hook that survives a failed all-reduce
        from torch_rsdp.torchft import DistributedDataParallel, ProcessGroupRSDP

        self.args, self.name = args, f"ft-{pg_kind}"
        rank, world = args.rank, args.world
        store_addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        timeout = timedelta(seconds=args.timeout)

        model = build(args)
        self.owns_default_group = args.mode == "hsdp"
        if args.mode == "hsdp":
            # FSDP2 inside the replica group, over an rsdp group of its ranks.
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            store = dist.TCPStore(store_addr, store_port, is_master=False,
                                  wait_for_workers=False)
            dist.init_process_group("rsdp", store=dist.PrefixStore("torchft_train/shard/", store),
                                    rank=rank, world_size=world, timeout=timeout)
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
            for layer in model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        elif world != 1:
            raise SystemExit("--mode ddp runs one rank per replica group (WORLD_SIZE=1); "
                             "use --mode hsdp for more")
        optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
        state_dict, load_state_dict = make_state_fns(model, optim)

        if pg_kind == "rsdp":
            self.pg = ProcessGroupRSDP(timeout=timeout)
        else:
            self.pg = ProcessGroupGloo(timeout)
        self.manager = manager = Manager(
            pg=self.pg, min_replica_size=args.min_replicas, load_state_dict=load_state_dict,
            state_dict=state_dict, replica_id=f"torchft_train_{args.group}", rank=rank,
            world_size=world, store_addr=store_addr, store_port=store_port,
            lighthouse_addr=lighthouse, timeout=timeout,
            quorum_timeout=timedelta(seconds=args.timeout * 2),
            # the quorum (and healing) completes in zero_grad(), before the forward pass, so a
            # healed replica's first step already computes with the weights it received
            use_async_quorum=False,
        )
        self.comm_s = 0.0  # this step's time in the cross-replica all-reduces (waited)
        if args.mode == "hsdp":
            def cross_replica_average(grad_shard: torch.Tensor) -> None:
                t0 = time.perf_counter()
                manager.allreduce(grad_shard).wait()  # AVG over the quorum's replica groups
                self.comm_s += time.perf_counter() - t0

            for m in [*model.layers, model]:
                m.set_all_reduce_hook(cross_replica_average)
        else:
            replica = self

            class TimedDDP(DistributedDataParallel):
                @staticmethod
                def _comm_hook(state, bucket):
                    t0 = time.perf_counter()
                    try:
                        return DistributedDataParallel._comm_hook(state, bucket)
                    finally:
                        replica.comm_s += time.perf_counter() - t0

            model = TimedDDP(manager, model)
        self.model = model
        self.optim = optim
        self.optimizer = OptimizerWrapper(manager, optim)
        self.lang = Language(args.vocab)
        self.first = True
        self.participants = None  # the previous step's quorum size

    def step(self):
        a, manager, t = self.args, self.manager, [time.perf_counter()]
        self.optimizer.zero_grad()  # starts the quorum (sync mode: waits for it, heals here)
        step = manager.current_step()
        participants = manager.num_participants()
        healed = self.first and a.attempt > 0
        if self.first:
            emit(a, "quorum", step=step, healed=step > 0 or a.attempt > 0,
                 participants=participants, t=time.time(),
                 quorum_s=time.perf_counter() - t[0])
            self.first = False
        # The state right after a heal, on the healed replica and on the live ones (whose
        # quorum grew at this step: the one the newcomer joined), for the launcher to compare
        # bit for bit: what the newcomer starts from must be what the survivors hold.
        if a.out and (healed or (self.participants is not None
                                 and participants > self.participants)):
            self.save_state(os.path.join(
                a.out, f"heal_g{a.group}_r{a.rank}_a{a.attempt}_s{step}.pt"))
        self.participants = participants
        x, y = self.lang.batch(step, a.group, a.rank, a.batch, a.seq, a.seed)
        t.append(time.perf_counter())
        loss = F.cross_entropy(self.model(x).flatten(0, 1), y.flatten())
        t.append(time.perf_counter())
        self.comm_s = 0.0
        loss.backward()  # the all-reduces, each waited for in the comm hook
        t.append(time.perf_counter())
        self.optimizer.step()  # should_commit: steps the optimizer only if every op succeeded
        t.append(time.perf_counter())
        return (step, loss.item(), manager.current_step() > step, manager.num_participants(),
                dict(_phases(t), allreduce=self.comm_s))

    def save(self, path: str) -> None:
        torch.save(_local(dict(self.model.state_dict())), path)

    def save_state(self, path: str) -> None:
        """This rank's model and optimizer state as they are now (local shards)."""
        torch.save({"model": _local(dict(self.model.state_dict())),
                    "optim": _local(self.optim.state_dict())}, path + ".tmp")
        os.replace(path + ".tmp", path)  # never a half-written file, were this rank killed

    def close(self):
        self.manager.shutdown(wait=False)
        self.pg.shutdown()
        if self.owns_default_group:
            dist.destroy_process_group()


def run_ft(args) -> None:
    """Trains until --steps steps are committed with every replica group in the quorum."""
    rep = FTReplica(args, args.pg, os.environ["TORCHFT_LIGHTHOUSE"],
                    int(os.environ["MASTER_PORT"]))
    emit(args, "ready", t_start=T_START, t_imported=T_IMPORTED, t_ready=time.time())
    _barrier_start(args)
    while True:
        t0 = time.perf_counter()
        step, loss, committed, participants, _ = rep.step()
        emit(args, "step", step=step, loss=loss, committed=committed,
             participants=participants, dt=time.perf_counter() - t0, t=time.time())
        if not math.isfinite(loss):
            raise SystemExit(f"loss {loss} at step {step}")
        done = rep.manager.current_step()
        # All members of a quorum see the same step and size, so they stop together.
        if committed and done >= args.steps and participants >= args.groups:
            break
        if args.max_steps and done >= args.max_steps:
            raise SystemExit(f"--max-steps {args.max_steps} reached without every replica "
                             f"group in the quorum")
    if args.out:
        rep.save(os.path.join(args.out, f"final_g{args.group}_r{args.rank}.pt"))
    emit(args, "done", step=rep.manager.current_step(), participants=participants)
    rep.close()


def run_bench(args) -> None:
    """Plain DDP, torchft + ProcessGroupRSDP and torchft + ProcessGroupGloo in this one
    process, one step of each in turn (the order rotating, the same on every rank), so that
    whatever else loads the machine loads all three alike. TORCHFT_TRAIN_BENCH (from the
    launcher): the plain group's store port, and a lighthouse and store per torchft setup."""
    cfg = json.loads(os.environ["TORCHFT_TRAIN_BENCH"])
    setups = [PlainDDP(args, cfg["plain_port"])]
    for kind in ("rsdp", "gloo"):
        setups.append(FTReplica(args, kind, cfg[kind]["lighthouse"], cfg[kind]["port"]))
    emit(args, "ready", t_start=T_START, t_imported=T_IMPORTED, t_ready=time.time())
    _barrier_start(args)
    for i in range(args.steps):
        for k in range(len(setups)):
            s = setups[(i + k) % len(setups)]
            t0 = time.perf_counter()
            step, loss, committed, participants, phases = s.step()
            emit(args, "bench_step", config=s.name, step=step, loss=loss, committed=committed,
                 participants=participants, dt=time.perf_counter() - t0, t=time.time(),
                 phases=phases)
    emit(args, "done", step=args.steps)
    for s in reversed(setups):
        s.close()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["ft", "bench"], default="ft",
                   help="bench: plain DDP, torchft+rsdp and torchft+gloo, a step of each in turn")
    p.add_argument("--mode", choices=["ddp", "hsdp"], default="ddp")
    p.add_argument("--pg", choices=["rsdp", "gloo"], default="rsdp",
                   help="the cross-replica process group (torchft's ProcessGroupGloo or ours)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop (with an error) here if not every replica group is back "
                        "(default 0: no limit; the survivors train on while one is away)")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds, every op and RPC")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--out", default="", help="directory for the final weights")
    p.add_argument("--json", action="store_true", help="events as JSON lines (the launcher's)")
    p.add_argument("--verbose", action="store_true", help="torchft's INFO logs")
    args = p.parse_args(argv)
    args.rank = int(os.environ.get("RANK", 0))
    args.world = int(os.environ.get("WORLD_SIZE", 1))
    args.group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    args.groups = int(os.environ.get("NUM_REPLICA_GROUPS", 2))
    args.attempt = int(os.environ.get("TORCHFT_TRAIN_ATTEMPT",
                                      os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    return args


def main(argv=None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        stream=sys.stderr)
    if args.role == "bench":
        run_bench(args)
    else:
        run_ft(args)


if __name__ == "__main__":
    main()
