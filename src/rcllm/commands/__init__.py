"""CLI command modules; each exposes `register(top, bench)` (see rcllm.cli)."""
