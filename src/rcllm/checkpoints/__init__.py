"""Sparse prefix checkpoints for recurrent and hybrid models (PAPERS.md §3)."""
