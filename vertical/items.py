"""The item a crawl emits: one document record that is new, changed or gone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DocumentItem:
    """One document record, as feed exports and ItemAdapter see it.

    ``key`` identifies the record within its page (the page URL for
    one-record pages, the ``key`` field's value with ``each``).
    """

    site: str
    document: str
    url: str
    key: str
    fields: dict[str, Any] = field(default_factory=dict)
    checksum: int = 0
    fetched_at: str = ""
    status: str = "new"  # "new" | "changed" | "gone"
