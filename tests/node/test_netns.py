"""in_netns refuses what is no network namespace with an OSError naming the
path, raised in the caller (entering one needs root: tests/kernel/node/)."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from kpng_py.node.netns import enter_netns, in_netns


def test_a_missing_namespace_is_raised_in_the_caller(tmp_path: Path) -> None:
    called: list[bool] = []
    with pytest.raises(FileNotFoundError):
        in_netns(tmp_path / "gone", lambda: called.append(True))
    assert called == []


def test_a_file_that_is_no_namespace_is_refused_naming_it() -> None:
    with pytest.raises(OSError, match="setns /dev/null: Invalid argument") as failure:
        in_netns("/dev/null", threading.current_thread)
    assert failure.value.errno == errno.EINVAL


def test_a_refused_enter_leaves_the_calling_thread_where_it_was() -> None:
    before = Path("/proc/thread-self/ns/net").stat().st_ino
    with pytest.raises(OSError):
        enter_netns("/dev/null")
    assert Path("/proc/thread-self/ns/net").stat().st_ino == before
