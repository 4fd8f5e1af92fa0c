"""The planner's prediction, and the table ``print(p.explain())`` shows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

__all__ = ["UnitPrediction", "Prediction", "explain"]


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


@dataclass
class UnitPrediction:
    name: str
    numel: int
    strategy: str
    resident_bytes: int       # resident + live (what the unit holds at the fwd/bwd turn)
    transient_bytes: int
    time_s: float
    runner_up: Optional[str] = None
    runner_up_time_s: Optional[float] = None   # the whole step's, with the runner-up here
    runner_up_peak_bytes: Optional[int] = None
    note: str = ""             # why its traffic is, or is not, compressed


@dataclass
class Prediction:
    budget_bytes: int
    peak_bytes: int
    step_time_s: float
    world: int
    nodes: int
    topology: str
    units: List[UnitPrediction] = field(default_factory=list)
    from_cache: bool = False
    checks: list = field(default_factory=list)   # [verify.PlanCheck]: the in-place race


def explain(pred: Prediction) -> str:
    hdr = (f"{'unit':<28} {'params':>12} {'strategy':<19} {'mem MiB':>9} {'peak+ MiB':>9} "
           f"{'time ms':>9}  runner-up (step ms, peak MiB)")
    lines = [f"plan for {pred.world} ranks on {pred.nodes} node(s), {pred.topology}"
             + (" (profile from cache)" if pred.from_cache else ""), hdr, "-" * len(hdr)]
    for u in pred.units:
        ru = "-"
        if u.runner_up is not None:
            ru = (f"{u.runner_up} ({u.runner_up_time_s * 1e3:,.1f}, "
                  f"{_mib(u.runner_up_peak_bytes)})")
        lines.append(f"{(u.name or '<root>')[:28]:<28} {u.numel:>12,} {u.strategy:<19} "
                     f"{_mib(u.resident_bytes):>9} {_mib(u.transient_bytes):>9} "
                     f"{u.time_s * 1e3:>9.1f}  {ru}")
    unused = pred.budget_bytes - pred.peak_bytes
    lines += ["-" * len(hdr),
              f"predicted peak per rank {_mib(pred.peak_bytes)} MiB of a "
              f"{_mib(pred.budget_bytes)} MiB budget ({_mib(unused)} MiB unused); "
              f"predicted step time {pred.step_time_s * 1e3:,.1f} ms",
              "mem = held through the step (sharded state) and from forward to backward "
              "(activations); peak+ = extra while the unit computes (gathered weights, "
              "buffers, temporaries); the runner-up is the best other strategy for that unit "
              "that fits with every other choice kept."]
    notes = [u for u in pred.units if u.note]
    if notes:
        lines += ["", "compression across nodes (link time saved by the rail fits, less the "
                      "quantisation kernels; residuals kept for error feedback):"]
        lines += [f"  {(u.name or '<root>')[:28]:<28} {u.note}" for u in notes]
    if pred.checks:
        lines += ["", "checked in place (a few training steps of each on a copy of the model: "
                      "slowest rank's median and the spread of its steps; peak per rank by "
                      "torch's MemTracker; the fastest that fits the budget is kept, a uniform "
                      "plan winning ties within the spread, or if none fits, the smallest):"]
        for c in pred.checks:
            lines.append(f"  {c.label:<24} predicted {c.predicted_s * 1e3:8.1f} ms/step, "
                         f"{_mib(c.predicted_peak_bytes):>7} MiB; measured "
                         f"{c.measured_s * 1e3:8.1f} ms/step (spread {c.measured_spread:3.0%}), "
                         f"{_mib(c.measured_peak_bytes):>7} MiB"
                         + ("   <- kept" if c.kept else ""))
    return "\n".join(lines)
