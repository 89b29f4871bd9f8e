"""KV chunk storage: content keys, the store interface and its tiers."""

from .base import ChunkKV, KVStore, MemoryLRUStore, chunk_key

__all__ = ["ChunkKV", "KVStore", "MemoryLRUStore", "chunk_key"]
