"""Benchmarks that print ratios against a baseline measured in the same run."""
