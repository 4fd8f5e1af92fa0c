"""torch_rsdp's benchmarks: one program, `python -m benchmarks SUITE [options]`, run from the
repository root (see __main__.py for the suites and docs/benchmarks.md for what each measures)."""
