"""Durations as users write them in config files: ``90``, ``90s``, ``15m``, ``1.5h``, ``2d``, ``1w``."""

from __future__ import annotations

import math
import re

__all__ = ["UNITS", "parse_duration", "unit_seconds"]

#: Seconds per unit suffix; no suffix means seconds.
UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}

_DURATION_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[smhdw]?)", re.IGNORECASE)


def unit_seconds(unit: str, value: object, what: str) -> float:
    """The seconds of ``unit``, in either case but ``M``: in a config a
    capital M is as likely a month as a minute."""
    if unit == "M":
        raise ValueError(f"not a {what}: {value!r} (M could be a month or a minute: write m for a minute)")
    return UNITS[unit.lower()]


def parse_duration(value: object) -> float:
    """Return *value* in seconds as a float.

    *value* is a number of seconds (int or float) or a string: a number with an
    optional unit suffix ``s``, ``m``, ``h``, ``d`` or ``w`` (``"1.5h"`` is
    5400.0). Raises :class:`ValueError` for anything else, including negative,
    infinite and NaN values and booleans (YAML's ``yes`` is not a duration).
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            raise ValueError(f"a duration cannot be negative: {value!r}")
        match = _DURATION_RE.fullmatch(text)
        if match is None:
            raise ValueError(
                f"not a duration: {value!r} (use seconds or a number with s, m, h, d or w, e.g. '90s', '1.5h', '2d')"
            )
        seconds = float(match["number"]) * unit_seconds(match["unit"], value, "duration")
    else:
        raise ValueError(f"not a duration: {value!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite: {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds
