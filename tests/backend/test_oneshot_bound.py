"""How a single-node CPU all-reduce is cut up (csrc/algorithms/select.cpp, [Note: one-shot
bound]; csrc/patterns/chunks.h, chunk_elems):

* up to the bound, one-shot (one exchange); above it reduce-scatter + all-gather. The bound is
  8 KiB (kNodeAllreduceOneshotBytes, csrc/algorithms/select.h), and the group reports it
  (`topology()["allreduce_oneshot_bytes"]`);
* reduce-scatter + all-gather gives every rank an equal share of a message shorter than its
  segment (before, a message up to a slot, 512 KiB at 2 ranks, was reduced by rank 0 alone
  while the others waited), at 2 ranks with a core each and at 4 taking turns on fewer cores.

Seen from outside through `comm_stats()["intra_node_messages"]`: one-shot stages once per rank;
reduce-scatter + all-gather with shares stages twice per rank (with the whole of a short
message on rank 0, every rank staged once: rank 0 nothing in the first exchange). Results are
checked exactly, at sizes that split into ragged shares. About 15 s.
"""

from __future__ import annotations

import pytest

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp", reason="rsdp's own choice")
KIB = 1024


def _worker(ctx, sizes):
    import torch
    import torch.distributed as dist

    import torch_rsdp

    n = dist.get_world_size()
    out = {"bound": torch_rsdp.topology()["allreduce_oneshot_bytes"], "exchanges": {}}
    for nbytes in sizes:
        count = nbytes // 4
        t = torch.arange(count, dtype=torch.float32) + ctx.rank
        torch_rsdp.reset_comm_stats()
        dist.all_reduce(t)
        out["exchanges"][nbytes] = torch_rsdp.comm_stats()["intra_node_messages"]
        want = n * torch.arange(count, dtype=torch.float32) + n * (n - 1) / 2
        assert torch.equal(t, want), f"rank {ctx.rank}: all_reduce of {nbytes} bytes is wrong"
    return out


@pytest.mark.parametrize("ranks", [2, 4], ids=["2-ranks", "4-ranks"])
def test_one_shot_up_to_the_bound_then_shares(ranks):
    bound = 8 * KIB
    ragged = 3 * bound + 4 * 13  # 13 floats past a whole number of lines
    sizes = [bound // 2, bound, 2 * bound, ragged]
    # The default staging (halves of 1 MiB): each size is one segment, shorter than the
    # ranks' slots (the harness' 64 KiB staging would cut the larger ones into full segments).
    env = {"RSDP_SHM_BYTES": "2M"}
    res = launch(_worker, ranks, (sizes,), env=env, deadline=120)
    for rank, out in enumerate(res.values()):
        assert out["bound"] == bound, (rank, out)
        assert out["exchanges"] == {bound // 2: 1, bound: 1, 2 * bound: 2, ragged: 2}, (rank, out)
