"""sandboxd benchmarks: `python bench/run.py` (see bench/README.md).

Every benchmark measures its baseline and sandboxd side by side in one run,
alternating rounds, because the machine these run on is small and noisy.
"""
