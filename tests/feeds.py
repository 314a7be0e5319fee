"""Feed storages for delivery tests: real Scrapy feed storages that behave
like remote ones (the file only exists once ``store`` is called)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from scrapy.extensions.feedexport import BlockingFeedStorage


class UploadAtCloseStorage(BlockingFeedStorage):
    """``upload:///path``: items are written to a temporary file and copied to
    ``path`` when the slot closes, as S3 or FTP feeds upload at close."""

    def __init__(self, uri: str, *, feed_options: dict[str, Any] | None = None) -> None:
        self.path = Path(urlsplit(uri).path)

    def _store_in_thread(self, file: IO[bytes]) -> None:
        file.seek(0)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("wb") as out:
            shutil.copyfileobj(file, out)


class FailingStorage(BlockingFeedStorage):
    """``fail:///anything``: the upload always fails."""

    def __init__(self, uri: str, *, feed_options: dict[str, Any] | None = None) -> None:
        pass

    def _store_in_thread(self, file: IO[bytes]) -> None:
        raise OSError("the feed storage is unreachable")
