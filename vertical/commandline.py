"""What vertical's Scrapy commands share, in a vertical project or not.

The commands are registered twice: by ``COMMANDS_MODULE = "vertical.commands"``
(in a project whose settings are vertical's) and by the ``scrapy.commands``
entry points of the installed package, which make them available in any
folder, inside another Scrapy project or none. There the settings are not
vertical's, so :class:`VerticalCommand` fills in the ``VERTICAL_*`` defaults
that the settings in force do not set: ``scrapy vertical-status`` in an
empty folder reads ``sqlite:///.vertical/frontier.sqlite3`` as a crawl there
would. Ctrl-C ends any of them with one line and exit status 130, as a
shell does, rather than a traceback.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

__all__ = ["VerticalCommand", "vertical_defaults"]


def vertical_defaults(settings: Any) -> list[str]:
    """Set, at ``default`` priority, every ``VERTICAL_*`` setting of
    :mod:`vertical.settings` that ``settings`` does not have; return their names."""
    from vertical import settings as defaults

    added = []
    for name in dir(defaults):
        if name.startswith("VERTICAL_") and settings.getpriority(name) is None:
            settings.set(name, getattr(defaults, name), priority="default")
            added.append(name)
    return added


class VerticalCommand(ScrapyCommand):
    """A command that reads vertical's settings and starts no crawl."""

    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "run" in cls.__dict__:
            cls.run = _interruptible(cls.__dict__["run"])  # type: ignore[method-assign]

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        assert self.settings is not None
        vertical_defaults(self.settings)
        for option in ("store", "to"):
            # An empty URI (an unset shell variable) is no store: not the default one.
            if isinstance(uri := getattr(opts, option, None), str) and not uri.strip():
                raise UsageError("no store URI given (an empty string)")


def _interruptible(run: Any) -> Any:
    """``run``, ending with one line and exit status 130 on Ctrl-C."""

    @functools.wraps(run)
    def wrapper(self: ScrapyCommand, args: list[str], opts: argparse.Namespace) -> None:
        try:
            run(self, args, opts)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            self.exitcode = 130
    return wrapper
