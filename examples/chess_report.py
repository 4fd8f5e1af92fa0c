"""What examples/finetune_chess.py shows at the end: the comparison table, plots and JSON.

    table(results)                   # markdown: speed, memory split, losses, legal moves
    write(results, meta, "out/")     # out/chess.json, out/chess_loss.png, out/chess_memory.png

``results`` are the runs' result dicts (``Run.result``); a run that could not start holds
``{"strategy", "backend", "error"}`` and shows as a row of dashes with the reason.
"""
from __future__ import annotations

import json
import os
from typing import List

from benchmarks import training_models as tm

#: The memory split of the table and plot: torch's MemTracker categories at the peak
#: (training_models.METHOD; "other" holds nothing here: every tensor held is a module's or the
#: optimizer's).
MEM_CATS = ("params", "buffers", "grads", "optim", "activations", "temp")


def _label(r) -> str:
    return f"{r['strategy']}:{r['backend']}"


def _pct(x) -> str:
    return "-" if x != x else f"{100 * x:.0f}%"


def table(results) -> str:
    hdr = ["run", "tokens/s", "ms/step", "peak mem/rank", *MEM_CATS, "peak RSS/rank",
           "final loss", "held-out loss",
           "legal moves (opening/middle/end)"]
    rows = []
    for r in results:
        if "error" in r:
            err = r["error"] if r["error"].startswith("rsdp:") else "not available: " + r["error"]
            rows.append([_label(r), err[:90]] + ["-"] * (len(hdr) - 2))
            continue
        bd = r["mem_breakdown_bytes"]
        thirds = "/".join(_pct(x) for x in r.get("legal_move_rate_by_third", []))
        rows.append([_label(r), f"{r['tokens_per_s']:,.0f}", f"{r['step_s'] * 1e3:.1f}",
                     tm.fmt_bytes(r["mem_peak_bytes"]),
                     *(tm.fmt_bytes(bd.get(c, float("nan"))) for c in MEM_CATS),
                     tm.fmt_bytes(r["rss_peak_bytes"]), f"{r['final_loss']:.4f}",
                     f"{r['eval_loss']:.4f}",
                     f"{_pct(r['legal_move_rate'])} ({thirds})" if thirds else
                     _pct(r["legal_move_rate"])])
    return tm.md_table(hdr, rows)


def _plot_loss(ok, path, title="") -> None:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in ok:
        ax.plot([p["elapsed_s"] for p in r["losses"]], [p["loss"] for p in r["losses"]],
                marker=".", label=_label(r))
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("loss (mean over ranks)")
    ax.set_yscale("log")
    ax.set_title("loss against time, per run" + (f"\n{title}" if title else ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_memory(ok, path, title="") -> None:
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [_label(r) for r in ok]
    bottom = [0.0] * len(ok)
    for c in MEM_CATS:
        vals = [r["mem_breakdown_bytes"].get(c, 0.0) / 2**20 for r in ok]
        ax.bar(names, vals, bottom=bottom, label=c)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("MiB per rank at the peak of a step")
    ax.set_title("peak memory per rank, split")
    ax.legend(fontsize=8)
    bx.bar(names, [r["tokens_per_s"] for r in ok], color="tab:gray")
    bx.set_ylabel("tokens/s (higher is better)")
    bx.set_title("throughput")
    for a in (ax, bx):
        a.tick_params(axis="x", labelrotation=30, labelsize=8)
        a.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(results, meta: dict, out_dir: str) -> List[str]:
    """Writes chess.json (``meta`` and every result) and, where matplotlib imports, the two
    plots into ``out_dir``; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "chess.json")]
    with open(paths[0], "w") as f:
        json.dump({**meta, "results": results}, f, indent=1)
    ok = [r for r in results if "error" not in r]
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        return paths
    if ok:
        for name, fn in (("chess_loss.png", _plot_loss), ("chess_memory.png", _plot_memory)):
            paths.append(os.path.join(out_dir, name))
            fn(ok, paths[-1], meta.get("title", ""))
    return paths
