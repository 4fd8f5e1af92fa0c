#!/usr/bin/env python3
"""Reads the sanitizer logs of a run of scripts/run_sanitized.sh and says whether it is clean.

Every process of the run (pytest, each rank it spawns, each native test binary, and whatever
else inherits the preloaded runtime: compilers, mpirun, ip) writes its reports to
``<dir>/report.<pid>``. This prints every report that concerns torch_rsdp and exits 1 if there
is one:

* any AddressSanitizer, UndefinedBehaviorSanitizer or ThreadSanitizer error: only our code is
  instrumented, so such a report is about our code or about what it hands to others;
* a leak whose allocation stack passes through our code (the extension, ``csrc/``, or a native
  test). Leaks of the interpreter, of torch and of the compilers are theirs: Python frees little
  at exit, by design. Indirect leaks (memory reachable only from a leaked block) follow their
  direct leak, so only direct leaks are judged.

    python3 scripts/sanitizers/sanitizer_reports.py build/sanitize-address/reports
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

#: Frames that are ours: the extension's sources, the native tests and fuzz targets, or the
#: extension's file itself where a frame has no source line.
OURS = re.compile(r"/csrc/|/tests/native/|/tests/fuzz/|torch_rsdp/_C[.a-z0-9_-]*\.so")
ERROR = re.compile(r"ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer|"
                   r"ERROR: ThreadSanitizer|ERROR: UndefinedBehaviorSanitizer|"
                   r"Sanitizer: CHECK failed")
LEAK_HEAD = re.compile(r"^(Direct|Indirect) leak of \d+ byte", re.M)


def leak_blocks(text: str):
    """(kind, block) for each leak of a LeakSanitizer report: its head line and its frames."""
    heads = list(LEAK_HEAD.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        block = text[m.start():end]
        block = block.split("\nSUMMARY:")[0].rstrip()
        yield m.group(1), block


def judge(path: Path):
    """(findings, ignored leaks) of one report file; findings are texts to print."""
    text = path.read_text(errors="replace")
    if ERROR.search(text):
        return [text], 0
    findings, ignored = [], 0
    for kind, block in leak_blocks(text):
        if kind == "Direct" and OURS.search(block):
            findings.append(block)
        else:
            ignored += 1
    return findings, ignored


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[1])
    files = sorted(folder.glob("report.*")) if folder.is_dir() else []
    bad, ignored = 0, 0
    for f in files:
        findings, n = judge(f)
        ignored += n
        for text in findings:
            bad += 1
            print(f"==== {f} ====\n{text.rstrip()}\n", flush=True)
    verdict = "FAILED" if bad else "clean"
    print(f"[sanitizer reports] {verdict}: {bad} report(s) about torch_rsdp in {len(files)} "
          f"log file(s) under {folder}; {ignored} leak(s) of other code (Python, torch, "
          "compilers) ignored")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
