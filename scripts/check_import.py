#!/usr/bin/env python3
"""Imports the freshly built extension in a child process; repairs a broken build once.

Why: a compiler wrapper (seen on a GPU machine: CXX=/opt/gcc/bin/g++) can build an extension
that links parts of libstdc++ into itself and segfaults at import, which would otherwise only
show up as a crash in the first test. The import runs in a subprocess, so a crash is reported,
not suffered. On failure this says which compiler built the extension (the `cxx` of the build's
ninja file, else $CXX, as torch's BuildExtension picks it) and, where that is not the system
compiler and the system compiler exists, removes the build's objects and the .so, rebuilds with
CXX=/usr/bin/g++ CC=/usr/bin/gcc and imports again.

Silent and exit 0 when the import works; exit 1 when it still fails (with what it printed).

    python3 scripts/check_import.py --rebuild "python3 setup.py -q build_ext --inplace"

--root, --module, --system-cxx/--system-cc exist for tests/project/test_check_import.py, which
plants a crashing module and a quick rebuild command instead of the real (minutes) build.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def say(msg: str) -> None:
    print(f"[check_import] {msg}", flush=True)


def try_import(root: Path, module: str):
    """(ok, why): imports `module` with `root` as the working directory (first on sys.path)."""
    p = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=root,
                       capture_output=True, text=True, timeout=300)
    if p.returncode == 0:
        return True, ""
    if p.returncode < 0:
        try:
            why = f"died from signal {signal.Signals(-p.returncode).name}"
        except ValueError:
            why = f"died from signal {-p.returncode}"
    else:
        why = f"failed (exit code {p.returncode})"
    tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-12:])
    return False, f"'import {module}' {why}" + (f":\n{tail}" if tail else "")


def built_with(root: Path) -> str:
    """The C++ compiler that built the extension: the ninja file's `cxx`, else $CXX, else c++."""
    for ninja in sorted(glob.glob(str(root / "build" / "temp.*" / "build.ninja"))):
        for line in Path(ninja).read_text(errors="replace").splitlines():
            if line.startswith("cxx = "):
                return line.split("=", 1)[1].strip()
    return os.environ.get("CXX", "c++")


def resolve(compiler: str) -> str:
    """The compiler's file with links followed (the first word: CXX may carry flags)."""
    exe = shutil.which(compiler.split()[0]) if compiler.strip() else None
    return os.path.realpath(exe) if exe else ""


def describe(compiler: str) -> str:
    path = resolve(compiler)
    if not path:
        return f"{compiler} (not found on PATH)"
    try:
        first = subprocess.run([compiler.split()[0], "--version"], capture_output=True, text=True,
                               timeout=30).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        first = []
    return f"{compiler} -> {path}: {first[0] if first else '(no --version)'}"


def clean(root: Path, module: str) -> None:
    """Removes what a rebuild must not reuse: build/'s objects and the extension's .so."""
    for d in glob.glob(str(root / "build" / "temp.*")) + glob.glob(str(root / "build" / "lib.*")):
        shutil.rmtree(d, ignore_errors=True)
    for so in glob.glob(str(root / module.replace(".", "/") / "_C*.so")):
        os.remove(so)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout to import from and clean")
    ap.add_argument("--module", default="torch_rsdp")
    ap.add_argument("--rebuild", default=f"{sys.executable} setup.py -q build_ext --inplace",
                    help="shell command that rebuilds the extension, run in --root")
    ap.add_argument("--log", type=Path, help="append the rebuild's output here (else printed)")
    ap.add_argument("--system-cxx", default="/usr/bin/g++")
    ap.add_argument("--system-cc", default="/usr/bin/gcc")
    ap.add_argument("--remember", type=Path,
                    help="after a repair, write 'CXX CC' here (setup.sh then builds with them "
                         "again instead of rebuilding everything with the broken compiler)")
    args = ap.parse_args(argv)

    ok, why = try_import(args.root, args.module)
    if ok:
        return 0
    compiler = built_with(args.root)
    say(why)
    say(f"the extension was built with CXX={describe(compiler)}; "
        f"CC={os.environ.get('CC', '(unset)')}")
    system = args.system_cxx
    if not os.path.exists(system):
        say(f"{system} does not exist, so there is no other compiler to rebuild with")
        return 1
    if resolve(compiler) == os.path.realpath(system):
        say(f"that is the system compiler ({system}) already: not a compiler wrapper problem")
        return 1
    say(f"rebuilding from clean with CXX={system} CC={args.system_cc} "
        f"(a compiler wrapper can build an extension that crashes at import)")
    clean(args.root, args.module)
    env = dict(os.environ, CXX=system, CC=args.system_cc)
    out = open(args.log, "a") if args.log else None
    try:
        rc = subprocess.run(args.rebuild, shell=True, cwd=args.root, env=env, stdout=out,
                            stderr=subprocess.STDOUT if out else None).returncode
    finally:
        if out:
            out.close()
    if rc != 0:
        say(f"the rebuild with {system} failed (exit code {rc})"
            + (f"; its output is in {args.log}" if args.log else ""))
        return 1
    ok, why = try_import(args.root, args.module)
    if not ok:
        say(why)
        say(f"still broken after a clean rebuild with {system}: giving up")
        return 1
    say(f"rebuilt with {system}: 'import {args.module}' works now")
    if args.remember:
        args.remember.parent.mkdir(parents=True, exist_ok=True)
        args.remember.write_text(f"{system} {args.system_cc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
