"""``Cluster``: plan for machines we do not have.

    plan.auto(model, batch, memory_budget="70GiB",
              topology=plan.Cluster(nodes=64, ranks_per_node=8, intra_node_GBps=150,
                                    inter_node_GBps=50, latency_us=10))

The planner then prices every collective from these figures instead of from the fits measured
here, and predicts that cluster's per-rank peak and step time. Assumptions (state them when you
quote a prediction):

* every rank computes as fast as a rank measured here (the per-unit forward/backward times and
  the optimizer's cost per byte are this machine's, at the example micro-batch);
* compressed candidates (``allow_compression=True``) quantise at ``quantize_GBps`` and
  dequantise at ``dequantize_GBps`` per rank (default: this machine's CPU kernels, far below
  a GPU's, so the gain predicted for a GPU cluster is then a lower bound);
* ``intra_node_GBps`` is what one rank moves to its node peers per second; ``inter_node_GBps``
  is one node's link per direction, shared by its ranks; ``latency_us`` is paid per
  sequential step of an algorithm;
* collectives are the backend's hierarchical ones: all-gather and reduce-scatter move
  (L-1)/L of the data inside the node and (N-1)/N of it across each node's link; all-reduce
  twice that; broadcast the data once at each level; a ring shift crosses each node link with
  one rank's tensor; a rail's collectives share the node link with the other L-1 rails.

Memory per rank does not depend on the links: it follows the strategies' rules with this
cluster's W = nodes x ranks_per_node and L = ranks_per_node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

from .._cost_terms import Fit, Links

__all__ = ["Cluster"]

_INF = float("inf")


def _fit(lat_s: float, seconds_per_byte: float) -> Fit:
    return Fit(lat_s, 1.0 / seconds_per_byte if seconds_per_byte > 0 else _INF)


@dataclass(frozen=True)
class Cluster:
    nodes: int
    ranks_per_node: int
    intra_node_GBps: float
    inter_node_GBps: float
    latency_us: float = 10.0
    #: Quantisation kernels (float32 GB/s per rank) for compressed candidates
    #: (``allow_compression``); None: as measured on this machine's CPU cores.
    quantize_GBps: Optional[float] = None
    dequantize_GBps: Optional[float] = None

    def __post_init__(self):
        for k in ("nodes", "ranks_per_node"):
            if getattr(self, k) < 1:
                raise ValueError(f"Cluster.{k} must be >= 1, got {getattr(self, k)}")
        for k in ("intra_node_GBps", "inter_node_GBps"):
            if not getattr(self, k) > 0:
                raise ValueError(f"Cluster.{k} must be > 0, got {getattr(self, k)}")
        for k in ("quantize_GBps", "dequantize_GBps"):
            v = getattr(self, k)
            if v is not None and not v > 0:
                raise ValueError(f"Cluster.{k} must be > 0 (or None: measured here), got {v}")

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def links(self) -> Links:
        N, L = self.nodes, self.ranks_per_node
        intra, inter = self.intra_node_GBps * 1e9, self.inter_node_GBps * 1e9
        lat = self.latency_us * 1e-6
        fits: Dict[str, Fit] = {}
        # per byte of the whole tensor, for the whole group (hierarchical algorithms)
        gather = (L - 1) / L / intra + ((N - 1) / N / inter if N > 1 else 0.0)
        steps = (L - 1) + (N - 1)
        fits["all_gather@group"] = _fit(lat * steps, gather)
        fits["reduce_scatter@group"] = _fit(lat * steps, gather)
        fits["all_reduce@group"] = _fit(2 * lat * steps, 2 * gather)
        fits["broadcast@group"] = _fit(lat * math.ceil(math.log2(max(2, N * L))),
                                       1 / intra + (1 / inter if N > 1 else 0.0))
        fits["ring_shift@group"] = _fit(lat, max(1 / intra, 1 / inter if N > 1 else 0.0))
        # inside one node
        fits["all_gather@intra"] = _fit(lat * (L - 1), (L - 1) / L / intra)
        fits["reduce_scatter@intra"] = fits["all_gather@intra"]
        fits["all_reduce@intra"] = _fit(2 * lat * (L - 1), 2 * (L - 1) / L / intra)
        fits["ring_shift@intra"] = _fit(lat, 1 / intra)
        # along a rail: L rails share each node's link
        if N > 1:
            rail = (N - 1) / N / (inter / L)
            fits["all_gather@inter"] = _fit(lat * (N - 1), rail)
            fits["reduce_scatter@inter"] = fits["all_gather@inter"]
            fits["all_reduce@inter"] = _fit(2 * lat * (N - 1), 2 * rail)
        q = 1 / (self.quantize_GBps * 1e9) if self.quantize_GBps else None
        d = 1 / (self.dequantize_GBps * 1e9) if self.dequantize_GBps else None
        return Links(self.world, N, fits, q, d)
