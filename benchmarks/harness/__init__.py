"""The loader benchmark harness (see benchmarks/bench.py): cases, runners, shaper, report."""
