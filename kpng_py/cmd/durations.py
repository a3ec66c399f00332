"""Durations on the command line: seconds (`1`, `0.5`, `2s`) or Go's
`time.ParseDuration` form, as KPNG's and kube-proxy's flags take them
(`500ms`, `1m30s`, `1.5h`, `250us`)."""

from __future__ import annotations

import math
import re

# Go's units, in seconds.
UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3,
                "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_SECONDS = re.compile(rf"[-+]?{_NUMBER}(?:[eE][-+]?\d+)?", re.ASCII)
_TERM = re.compile(rf"({_NUMBER})(ns|us|\u00b5s|\u03bcs|ms|s|m|h)", re.ASCII)
_GO_DURATION = re.compile(rf"[-+]?(?:{_NUMBER}(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+", re.ASCII)


class DurationError(ValueError):
    """Not a duration; the message says what one looks like."""


def parse_seconds(text: str) -> float:
    """`text` as seconds: a plain number is seconds, otherwise a Go duration,
    its terms summed (`1m30s` is 90, `-2s` is -2). `nan` and `inf` are
    refused; bounds are the caller's."""
    if _SECONDS.fullmatch(text):
        seconds = float(text)
    elif _GO_DURATION.fullmatch(text):
        sign = -1.0 if text.startswith("-") else 1.0
        seconds = sign * sum(float(number) * UNIT_SECONDS[unit]
                             for number, unit in _TERM.findall(text))
    else:
        raise DurationError(f"{text!r} is not a duration (seconds, e.g. 1 or 0.5, or Go's "
                            "form, e.g. 500ms, 2s, 1m30s)")
    if not math.isfinite(seconds):
        raise DurationError(f"{text!r} is not a finite duration")
    return seconds
