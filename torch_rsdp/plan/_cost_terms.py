"""The terms a strategy handler prices a unit in, shared by the handlers and the planner.

:class:`UnitProfile` (what was measured of one unit), :class:`Fit` (one collective's time as a
function of its bytes), :class:`Links` (the group's shape and its collectives' fits) and
:class:`Cost` (one strategy's memory and communication for one unit). The handlers
(:meth:`~torch_rsdp.plan._strategies.StrategyHandler.cost`) compute a ``Cost`` from the other
three; the planner (:mod:`.planner`) measures profiles and links and turns costs into choices.
Both import this module; it imports neither (only the backend's :mod:`torch_rsdp._compression`,
for the quantisation kernels' speed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .._compression import quantize_seconds

__all__ = ["UnitProfile", "Fit", "Links", "Cost", "kernel_s_per_byte"]


@dataclass
class UnitProfile:
    name: str
    numel: int
    param_bytes: int
    linear_bytes: int        # weights split:k can slice
    rotate_bytes: int        # parameters rotate can shard
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    act_bytes: int = 0
    temp_bytes: int = 0
    signature: str = ""
    # forward + backward seconds of the unit with each strategy applied, communication
    # included (measured here; absent for units that cannot run alone, e.g. the root)
    strategy_s: Dict[str, float] = field(default_factory=dict)
    # [Note: frozen parameters in the cost model]
    # The bytes of each part above that need no gradient (``requires_grad=False``: a frozen
    # base under LoRA, parts frozen by hand). A frozen parameter holds no gradient and no
    # optimizer state, is not stepped, and no strategy reduces a gradient for it: every
    # handler prices parameters at P and gradients, optimizer state and gradient traffic at
    # the trainable part only, so a frozen 1B base with adapters fits a budget sized for the
    # base alone. (The coefficients of the temporaries were fitted on fully trained units;
    # their gradient share is scaled to the trainable part.)
    frozen_bytes: int = 0
    frozen_linear: int = 0
    frozen_rotate: int = 0

    @property
    def trainable(self) -> int:
        """Bytes of parameters that get a gradient, an optimizer state and a step."""
        return self.param_bytes - self.frozen_bytes

    @property
    def trainable_linear(self) -> int:
        return self.linear_bytes - self.frozen_linear

    @property
    def trainable_rotate(self) -> int:
        return self.rotate_bytes - self.frozen_rotate


@dataclass
class Fit:
    latency_s: float
    bytes_per_s: float

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s if nbytes > 0 else 0.0


@dataclass
class Links:
    """The group's shape, the time of each collective kind at each level, and the
    quantisation kernels' seconds per float32 byte (quantising, dequantising; measured on
    this machine unless given)."""

    world: int
    nodes: int
    fits: Dict[str, Fit]
    quantize_s_per_byte: Optional[float] = None
    dequantize_s_per_byte: Optional[float] = None

    def kernels(self) -> Tuple[float, float]:
        if self.quantize_s_per_byte is None or self.dequantize_s_per_byte is None:
            q, d = kernel_s_per_byte()
            self.quantize_s_per_byte = self.quantize_s_per_byte or q
            self.dequantize_s_per_byte = self.dequantize_s_per_byte or d
        return self.quantize_s_per_byte, self.dequantize_s_per_byte

    @property
    def local(self) -> int:
        return self.world // self.nodes

    def t(self, kind: str, nbytes: float, level: str = "group") -> float:
        if nbytes <= 0:
            return 0.0
        fit = self.fits.get(f"{kind}@{level}")
        if fit is None:
            return 0.0  # a level this group does not have (one node: no rail)
        return fit.time(nbytes)

    @classmethod
    def measured(cls, prof) -> "Links":
        """The links of a :class:`~torch_rsdp.plan._planner.profile.Profile`."""
        return cls(prof.world, len(prof.nodes), prof.fits)


_KERNELS: List[Tuple[float, float]] = []


def kernel_s_per_byte() -> Tuple[float, float]:
    """Seconds per float32 byte of this machine's int8 quantise and dequantise kernels (one
    core, 16 MiB; measured once per process)."""
    if not _KERNELS:
        n = 1 << 22
        q, d = quantize_seconds(n, "int8", 512)
        _KERNELS.append((q / (4 * n), d / (4 * n)))
    return _KERNELS[0]


@dataclass
class Cost:
    """One strategy's cost for one unit, per rank (bytes; seconds). See
    :mod:`torch_rsdp.plan._planner.cost` for the notation and where the coefficients come
    from."""

    state: float            # parameters and optimizer state held all step
    grads: float            # gradients, from the unit's backward to the optimizer step
    live: float             # held from the unit's forward to its backward
    transient: float        # only while the unit computes
    comm_s: float           # communication, modelled from the links
    stepped: float          # parameter bytes this rank's optimizer steps
    after_step_comm_s: float = 0.0   # communication after the optimizer step (measured runs too)
    step_bytes: float = 0.0          # what the optimizer step itself adds
    accumulation_bytes: float = 0.0  # unsharded gradients kept between no_sync micro-batches
