"""Performance and accuracy benchmarks (results in BENCHMARKS.md): scripts, run as `python benchmarks/NAME.py`."""
