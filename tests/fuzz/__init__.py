"""The fuzz targets' committed inputs, run once each (the timed fuzzing is scripts/run_fuzz.sh).
See README.md."""
