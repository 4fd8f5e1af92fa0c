"""Checks of the project as a whole: the import rules of the package docstrings, and the
documentation's links. See README.md."""
