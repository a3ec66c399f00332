"""The flag values backends' flags take too (kpng_py/cmd/flag_types.py):
positive durations with a bound, and sizes in bytes."""

from __future__ import annotations

import argparse
import re

import pytest

from kpng_py.cmd.flag_types import MAX_SECONDS, byte_size, positive_duration


@pytest.mark.parametrize("text, seconds", [
    ("2", 2.0), ("0.25", 0.25), ("1m30s", 90.0), ("500ms", 0.5), (str(MAX_SECONDS), MAX_SECONDS),
])
def test_a_positive_duration_is_in_seconds(text: str, seconds: float) -> None:
    assert positive_duration(text) == seconds


@pytest.mark.parametrize("text, message", [
    ("0", "'0' must be more than 0 seconds"),
    ("-1s", "'-1s' must be more than 0 seconds"),
    (str(MAX_SECONDS + 1), f"'{MAX_SECONDS + 1}' is more than the longest duration, "
                           f"{MAX_SECONDS} seconds (about 24 days)"),
    ("soon", "'soon'"),  # the duration parser's own message, whatever it says
])
def test_a_duration_that_is_not_positive_or_too_long_is_refused(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="^" + re.escape(message)):
        positive_duration(text)


@pytest.mark.parametrize("text, size", [
    ("4194304", 4194304), ("4k", 4096), ("4M", 4 << 20), ("1g", 1 << 30),
])
def test_a_size_is_bytes_or_kib_mib_gib(text: str, size: int) -> None:
    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["0", "0k", "", "M", "-4", "4T", "1.5m", "\uff14k", "\u0664"])
def test_what_is_no_positive_size_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"is not a size in bytes \(e\.g\. 4194304 or 4M\)$"):
        byte_size(text)
