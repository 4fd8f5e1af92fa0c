"""Tests of the c10d backend: torch's collectives and Backend contract, ring shifts, communication
memory, faults, failure notice, shrinking, leaks. See README.md."""
