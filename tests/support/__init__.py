"""Shared test helpers: the multi-process launcher (harness), deterministic values, the
collective families, models and plans, traffic theory. Imported as ``support.<module>``
(tests/ is on sys.path, see tests/conftest.py). See README.md."""
