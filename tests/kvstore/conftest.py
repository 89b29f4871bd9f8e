import pytest
from kv_helpers import FP

from rcllm.kvstore.codec import KeyCheck
from rcllm.kvstore.redis_server import RedisServer, redis_server_path


@pytest.fixture
def check() -> KeyCheck:
    return KeyCheck(FP)


@pytest.fixture
def redis_server():
    """A private redis-server on a free loopback port; skips when the binary is absent."""
    if redis_server_path() is None:
        pytest.skip("redis-server not installed")
    server = RedisServer().start()
    yield server
    server.stop()
