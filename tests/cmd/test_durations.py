"""Durations: seconds or Go's form, as KPNG's flags take them."""

from __future__ import annotations

import pytest

from kpng_py.cmd.durations import DurationError, parse_seconds


@pytest.mark.parametrize("text, seconds", [
    ("1", 1.0), ("0.5", 0.5), (".5", 0.5), ("1e3", 1000.0), ("-1", -1.0),
    ("2s", 2.0), ("500ms", 0.5), ("250us", 250e-6), ("250\u00b5s", 250e-6), ("10ns", 10e-9),
    ("1m30s", 90.0), ("1.5h", 5400.0), ("1h1m1s1ms", 3661.001), ("-2s", -2.0),
])
def test_seconds_and_go_durations(text: str, seconds: float) -> None:
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "x", "s", "1x", "1 s", "1s2", "nan", "inf", "1e400",
                                  "2d", "1.2.3s", "--1s"])
def test_what_is_not_a_duration_says_what_one_looks_like(text: str) -> None:
    with pytest.raises(DurationError, match="duration"):
        parse_seconds(text)
