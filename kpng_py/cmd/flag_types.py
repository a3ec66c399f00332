"""Values of the command line's flags that backends' flags take too:
durations and sizes."""

from __future__ import annotations

import argparse

from kpng_py.cmd.durations import DurationError, parse_seconds

# gRPC keeps its timers in 32-bit milliseconds; every duration flag has its bound.
MAX_SECONDS = (2**31 - 1) // 1000


def positive_duration(text: str) -> float:
    """A duration (seconds or Go's form, kpng_py/cmd/durations.py), more than 0,
    at most MAX_SECONDS (about 24 days)."""
    try:
        value = parse_seconds(text)
    except DurationError as err:
        raise argparse.ArgumentTypeError(str(err))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than the longest duration, {MAX_SECONDS} seconds (about 24 days)")
    return value


def byte_size(text: str) -> int:
    """A size in bytes, more than 0: a number in ASCII digits, or one with k,
    m or g (KiB, MiB, GiB)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    digits = text[:-1] if text[-1:].lower() in units else text
    if not (digits.isascii() and digits.isdecimal()) or int(digits) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 4194304 or 4M)")
    return int(digits) * scale
