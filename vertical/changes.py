"""Change detection (the Rambler crawler): CRC32 over extracted fields, not raw HTML.

Pure functions. A page's checksum covers all its records, so it drives the
page's refetch delay; per-record checksums decide which records of a
many-record page are emitted.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class RecordLike(Protocol):
    document: str
    key: str
    fields: Mapping[str, Any]


def canonical_json(value: Any) -> bytes:
    """Serialisation independent of dict order and of insignificant spacing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_checksum(document: str, fields: Mapping[str, Any]) -> int:
    return zlib.crc32(canonical_json([document, fields]))


def page_checksum(records: Mapping[str, Mapping[str, Any]]) -> int:
    """CRC32 of all records of a page (``key -> {"document", "fields"}``).

    Never 0 for a page with records: 0 means "never fetched" in the store.
    """
    if not records:
        return 0
    crc = zlib.crc32(canonical_json({k: [r["document"], r["fields"]] for k, r in records.items()}))
    return crc or 1


@dataclass(slots=True)
class PageDiff:
    """What changed on a page since its last fetch."""

    docs: dict[str, dict[str, Any]]  # the page's records now, as stored
    checksum: int
    new: list[str] = field(default_factory=list)  # record keys
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    gone: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> old stored record

    @property
    def page_changed(self) -> bool:
        return bool(self.new or self.changed or self.gone)

    def harvest(self) -> float:
        """Information gained (S.C.E.N.T.): log(size + 1) of what changed."""
        size = sum(len(canonical_json(self.docs[k]["fields"])) for k in (*self.new, *self.changed))
        size += sum(len(canonical_json(d.get("fields", {}))) for d in self.gone.values())
        return math.log(size + 1) if size else 0.0


def diff_page(old_docs: Mapping[str, Mapping[str, Any]], records: Iterable[RecordLike]) -> PageDiff:
    """Compare a page's extracted records with those stored from its last fetch."""
    docs: dict[str, dict[str, Any]] = {}
    for rec in records:
        docs[rec.key] = {
            "document": rec.document,
            "checksum": record_checksum(rec.document, rec.fields),
            "fields": dict(rec.fields),
        }
    diff = PageDiff(docs=docs, checksum=page_checksum(docs))
    for key, doc in docs.items():
        old = old_docs.get(key)
        if old is None:
            diff.new.append(key)
        elif old.get("checksum") != doc["checksum"]:
            diff.changed.append(key)
        else:
            diff.unchanged.append(key)
    diff.gone = {k: dict(v) for k, v in old_docs.items() if k not in docs}
    return diff
