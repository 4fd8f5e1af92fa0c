"""Ring redistribution and RSDP across emulated nodes.

The same workers as test_ring_shift.py and test_rsdp.py, with the ranks spread over nodes
(network namespaces joined by veth links, or RSDP_NODE_ID on the loopback where namespaces
cannot be created; see test_multinode.py). The ring is node-major, so for these placements it
is the rank order the workers assume, and one hop in every rotation crosses each node link.
"""
from __future__ import annotations

import pytest

from backend import test_ring_shift as rs
from rsdp import test_rsdp
from support.harness import backend_under_test, format_family_failures, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="ring_shift and RSDP are rsdp-only")

PLACEMENTS = {"2x2": (0, 0, 1, 1), "3x1": (0, 1, 2)}
RSDP_FAMILIES = ("linear", "embedding", "attention", "transformer", "adam")


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("worker", [rs._shift_worker, rs._reduce_worker, rs._async_worker],
                         ids=["shift", "shift_reduce", "in_flight"])
def test_ring_shift_across_nodes(nodes, placement, worker):
    node_of = PLACEMENTS[placement]
    launch(worker, len(node_of), node_of=node_of, netns=nodes, deadline=240)


def test_rsdp_two_nodes(nodes):
    """Linear (both splits), Embedding, attention, a small transformer and Adam training match
    single-process training with 2 nodes x 2 ranks."""
    node_of = PLACEMENTS["2x2"]
    res = launch(test_rsdp.families_worker, len(node_of), (list(RSDP_FAMILIES),),
                 node_of=node_of, netns=nodes, deadline=400, pg_timeout=60)
    results = {r: res[r] for r in range(len(node_of))}
    for fam in RSDP_FAMILIES:
        msg = format_family_failures(results, fam)
        assert msg is None, msg
