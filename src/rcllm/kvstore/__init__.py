"""KV chunk storage: content keys, the store interface and its tiers.

`RedisStore` is imported from `rcllm.kvstore.redis_store` directly, so that importing this
package does not import the redis client.
"""

from .base import ChunkKV, KVStore, MemoryLRUStore, chunk_key
from .disk import DiskStore
from .tiered import TieredStore

__all__ = ["ChunkKV", "KVStore", "MemoryLRUStore", "chunk_key", "DiskStore", "TieredStore"]
