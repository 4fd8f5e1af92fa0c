"""Going on in process after a lost rank, for the examples (``--on-failure shrink``).

    recovery = ShrinkOnFailure(window_s=3)
    while True:
        build the model and optimizer on the current default group, resume from the newest
        checkpoint (examples/training_checkpoints.py)
        try:
            train; break
        except RuntimeError as e:
            recovery.recover(e)       # agree on who is gone, shrink the default group

When a collective fails, every survivor writes "alive" under a key of this failure in the
default group's store and waits ``window_s`` for the others; the ranks that never write are
gone. The first survivor to decide stores its list with ``compare_set`` and every survivor
takes that one, so all shrink alike even if one of them was slower to notice (a survivor the
list names exits rather than hang). Then ``dist.shrink_group(gone, SHRINK_ABORT)``: a new
default group over the survivors, ranks renumbered. Everything made on the old groups (the
sharded model, its optimizer) is dropped and rebuilt by the caller on the new world.

The store must outlive the lost rank: under ``torchrun`` the agent hosts it, with the
examples' ``--nproc`` launcher the parent process does. (torchrun's agent itself stops every
worker when one fails and restarts them all, so in-process recovery is for launchers that
let the survivors live: the examples' own, or ``srun --no-kill``.)
"""
from __future__ import annotations

import json
import time
from typing import List

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.distributed_c10d import SHRINK_ABORT

__all__ = ["ShrinkOnFailure", "Excluded"]


class Excluded(SystemExit):
    """This rank was slower than the window and the survivors went on without it."""


class ShrinkOnFailure:
    def __init__(self, window_s: float = 3.0):
        self.window_s = window_s
        self.failures = 0
        self.failed_at = None  # time.perf_counter() of the last failure
        self.timings: dict = {}

    def _gone(self, store, prefix: str, world: int, rank: int) -> List[int]:
        store.set(f"{prefix}alive/{rank}", "1")
        keys = [f"{prefix}alive/{r}" for r in range(world)]
        deadline = time.monotonic() + self.window_s
        while time.monotonic() < deadline:
            if store.check(keys):
                break
            time.sleep(0.05)
        mine = [r for r in range(world) if not store.check([keys[r]])]
        # The first view stored is everyone's.
        agreed = store.compare_set(f"{prefix}gone", "", json.dumps(mine))
        return json.loads(agreed)

    def recover(self, error: BaseException) -> List[int]:
        """Called by every survivor with the error its collective raised; returns the ranks
        (of the old default group) that were excluded."""
        self.failed_at = time.perf_counter()
        self.failures += 1
        rank, world = dist.get_rank(), dist.get_world_size()
        store = c10d._get_default_store()
        gone = self._gone(store, f"rsdp-example-recovery/{self.failures}/", world, rank)
        if not gone:
            raise error  # every rank is alive: not a lost rank, so nothing to shrink away
        if rank in gone:
            raise Excluded(f"rank {rank}: the survivors went on without this rank")
        agreed = time.perf_counter()
        dist.shrink_group(gone, shrink_flags=SHRINK_ABORT)
        done = time.perf_counter()
        self.timings = {"agree_s": agreed - self.failed_at, "shrink_s": done - agreed}
        if dist.get_rank() == 0:  # the new rank 0: the old one may be gone
            print(f"recovery: rank(s) {gone} of {world} lost ({str(error).splitlines()[0][:160]}); "
                 f"the survivors agreed in {self.timings['agree_s']:.2f} s and shrank to "
                  f"{dist.get_world_size()} ranks in {self.timings['shrink_s'] * 1e3:.0f} ms",
                  flush=True)
        return gone
