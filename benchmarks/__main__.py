"""`python -m benchmarks SUITE [options]`: runs one suite; `python -m benchmarks --help` lists
them. Every suite writes its figures, with the command line, commit and machine, under
benchmarks/results/ (common.write_result)."""

from __future__ import annotations

import importlib
import os
import sys

# suite -> (module, what it measures)
SUITES = {
    "collectives": ("collectives", "nccl-tests-style sweep of the collectives: rsdp against "
                                   "gloo/nccl, optionally Open MPI and oneCCL"),
    "launches": ("launches", "alternating launches of rsdp (or rsdp under --variants of its "
                             "environment) and its peers: per-launch medians"),
    "comm-memory": ("comm_memory", "FSDP2 steps with buffers from communication memory against "
                                   "torch.empty"),
    "rsdp-fsdp2": ("rsdp_fsdp2", "RSDP variants against FSDP2 and DDP in one process group: "
                                 "speed and memory per setting, CPU or CUDA"),
    "finetune": ("finetune", "LoRA fine-tuning of a Llama shape: RSDP, RSDP units and FSDP2, "
                             "with and without checkpointing"),
    "plans": ("plans", "the planner's plan against every uniform strategy on emulated nodes"),
    "strategies": ("strategies", "every sharding plan (and compression) on 1x4 and 2x2 "
                                 "emulated nodes: step time and memory"),
    "checkpoint": ("checkpoint", "distributed checkpoint save and load times per plan"),
    "multinode": ("multinode", "collectives across emulated nodes behind a rate-limited link, "
                               "with Open MPI as a peer"),
    "scale": ("scale", "set-up time, memory, fds and failure notice from 2 to 32 ranks"),
}


def usage() -> str:
    width = max(map(len, SUITES))
    lines = ["usage: python -m benchmarks SUITE [options]   (SUITE --help for its options)",
             "", "suites:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in SUITES.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUITES:
        print(f"unknown suite {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    os.environ["RSDP_BENCH_SUITE"] = name  # the command line common.write_result records
    module = importlib.import_module(f"benchmarks.{SUITES[name][0]}")
    sys.argv = [f"python -m benchmarks {name}", *rest]
    try:
        return module.main(rest) or 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
