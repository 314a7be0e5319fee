"""Scrapy commands of the project.

Inside a project whose settings are vertical's, ``COMMANDS_MODULE =
"vertical.commands"`` makes Scrapy load every module here, naming each
command after its module (hence ``vertical-status.py``): ``crawl``, ``parse``
and ``fetch`` replace Scrapy's own there, aware of the ``vertical`` spider.

In any other folder, the ``scrapy.commands`` entry points of pyproject.toml
register the commands that need no project (``vertical-init``,
``vertical-status``, ``vertical-check``, ``vertical-monitor``,
``frontier_export``, ``frontier_import``). An entry point cannot name a
module with a hyphen, so it names an attribute of this package, which
imports the command's module on first use (:pep:`562`).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Attribute named by an entry point -> the module of its command.
ENTRY_POINTS = {
    "Init": "vertical-init",
    "Status": "vertical-status",
    "Check": "vertical-check",
    "Monitor": "vertical-monitor",
    "FrontierExport": "frontier_export",
    "FrontierImport": "frontier_import",
}


def __getattr__(name: str) -> Any:
    module = ENTRY_POINTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{module}").Command
