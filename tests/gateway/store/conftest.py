import uuid

import pytest
import pytest_asyncio

from priority_gateway.store import MemoryStore, RedisStore, SqliteStore
from tests.support.redis import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest_asyncio.fixture(params=["memory", "sqlite", "redis"], loop_scope="function")
async def store(request, tmp_path):
    if request.param == "memory":
        backend = MemoryStore()
    elif request.param == "sqlite":
        backend = SqliteStore(tmp_path / "data" / "gateway.db")
    else:
        server = request.getfixturevalue("redis_server")
        backend = RedisStore(server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    await backend.open()
    yield backend
    await backend.close()
