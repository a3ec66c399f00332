"""The cyclic garbage collector paused around a change set and given back
as it was, also when applying it fails."""

from __future__ import annotations

import gc
from typing import Iterator

import pytest

from kpng_py.runtime.collector import CollectorPause, collector_paused, freeze_survivors


@pytest.fixture(autouse=True)
def _collector_enabled() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_paused_inside_the_block_and_enabled_after() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_block_that_raises_gives_the_collector_back() -> None:
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("the apply failed")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_a_pause_across_calls_resumes_once_whatever_the_pauses() -> None:
    pause = CollectorPause()
    pause.pause()
    pause.pause()  # a second batch of ops of the same change set
    assert not gc.isenabled()
    pause.resume()
    assert gc.isenabled()


def test_a_paused_block_stays_paused_until_resume_unless_it_raises() -> None:
    pause = CollectorPause()
    with pause.paused():
        pass
    assert not gc.isenabled()
    pause.resume()
    with pytest.raises(ValueError), pause.paused():
        raise ValueError("the change set is given up")
    assert gc.isenabled()


def test_survivors_are_frozen_out_of_the_collected_generations() -> None:
    survivor = [object() for _ in range(10)]
    freeze_survivors()
    assert gc.get_freeze_count() >= len(survivor)
