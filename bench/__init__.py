"""Benchmarks of jobsched: each module runs as ``python -m bench.<name>``; see bench/README.md."""
