"""Shared fixtures: a real redis-server for the session, frontiers of each backend."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer
from vertical.frontier import Frontier, open_frontier

_redis_dbs = itertools.cycle(range(1, 64))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One ``redis-server`` on a free loopback port for the whole session
    (no persistence; tests that restart Redis start their own)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    with RedisServer(appendonly=False) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/DB`` of an empty database of the session server."""
    db = next(_redis_dbs)
    client = redis_server.client(db)
    client.flushdb()
    client.close()
    return f"{redis_server.url}/{db}"


@pytest.fixture(params=["sqlite", "redis"])
def frontier_uri(request: pytest.FixtureRequest, tmp_path) -> str:
    """The URI of an empty store of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'frontier.sqlite3'}"
    return request.getfixturevalue("redis_url")


@pytest.fixture
def frontier(frontier_uri: str) -> Iterator[Frontier]:
    """An empty frontier of each backend (open more handles on ``frontier.uri``)."""
    with open_frontier(frontier_uri) as store:
        yield store
