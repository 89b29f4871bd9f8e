"""rcllm: beyond-prefix KV cache reuse with selective recomputation for LLM recommendation."""

__version__ = "0.1.0"
