"""Frontier backends, chosen by the ``VERTICAL_STORE`` URI."""

from __future__ import annotations

from vertical.frontier.base import ALL, Frontier, Lane, StoreLost, StoreUnavailable, UnsuitableStore

__all__ = ["ALL", "Frontier", "Lane", "StoreLost", "StoreUnavailable", "UnsuitableStore", "open_frontier"]


def open_frontier(uri: str, **redis_params: object) -> Frontier:
    """Open the store named by ``uri``: ``sqlite:///path`` or ``redis://host:port/db``."""
    if uri.startswith("sqlite:///"):
        from vertical.frontier.sqlite import SQLiteFrontier

        return SQLiteFrontier.from_uri(uri)
    if uri.startswith(("redis://", "rediss://", "unix://")):
        from vertical.frontier.redis import RedisFrontier

        return RedisFrontier.from_uri(uri, **redis_params)
    raise ValueError(
        f"VERTICAL_STORE: unsupported store URI {uri!r} "
        "(expected sqlite:///relative/path, sqlite:////absolute/path or redis://host:port/db)"
    )
