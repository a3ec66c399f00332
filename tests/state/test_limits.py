"""The --max-* flags of `local` and `file ... to-local`: their defaults,
their values, and what they refuse."""

from __future__ import annotations

import argparse

import pytest

from kpng_py.state.limits import Limits, add_limit_flags, limits_from_args


def test_limit_flags() -> None:
    parser = argparse.ArgumentParser()
    add_limit_flags(parser)
    assert limits_from_args(parser.parse_args([])) == Limits()
    assert limits_from_args(parser.parse_args(
        ["--max-service-ports", "5", "--max-service-endpoints", "6", "--max-endpoints", "7"])
    ) == Limits(max_service_ports=5, max_service_endpoints=6, max_endpoints=7)
    for bad in ("0", "-1", "x", "1.5", ""):
        with pytest.raises(SystemExit):
            parser.parse_args(["--max-endpoints", bad])
    help_text = parser.format_help()
    for flag, default in (("--max-service-ports", 1000), ("--max-service-endpoints", 100000),
                          ("--max-endpoints", 2000000)):
        assert flag in help_text and f"(default: {default})" in " ".join(help_text.split())
