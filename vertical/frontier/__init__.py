"""Frontier backends, chosen by the ``VERTICAL_STORE`` URI."""

from __future__ import annotations

from vertical.frontier.base import ALL, Frontier, Lane, StoreLost, StoreUnavailable, UnsuitableStore

__all__ = ["ALL", "REDIS_SCHEMES", "Frontier", "Lane", "StoreLost", "StoreUnavailable", "UnsuitableStore",
           "check_store_uri", "open_frontier"]

#: How a Redis store's URI starts (the others are sqlite:///).
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def check_store_uri(uri: str) -> None:
    """Raise :class:`UnsuitableStore` naming what is wrong with ``uri`` as
    written (its scheme, a port, a database, a parameter), without opening
    it: a crawl checks its ``VERTICAL_STORE`` so before any component starts."""
    if uri.startswith("sqlite:///"):
        return
    if uri.startswith(REDIS_SCHEMES):
        from vertical.frontier.redis import RedisFrontier

        RedisFrontier.parse_uri(uri)
        return
    raise UnsuitableStore(
        f"unsupported store URI {uri!r} "
        "(expected sqlite:///relative/path, sqlite:////absolute/path, redis://host:port/db, "
        "rediss://host:port/db or unix:///path/redis.sock?db=N)"
    )


def open_frontier(uri: str, **redis_params: object) -> Frontier:
    """Open the store named by ``uri``: ``sqlite:///path`` or ``redis://host:port/db``."""
    if uri.startswith(REDIS_SCHEMES):
        from vertical.frontier.redis import RedisFrontier

        return RedisFrontier.from_uri(uri, **redis_params)  # checks the URI as check_store_uri does
    check_store_uri(uri)
    from vertical.frontier.sqlite import SQLiteFrontier

    return SQLiteFrontier.from_uri(uri)
