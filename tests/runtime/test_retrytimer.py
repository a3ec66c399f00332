"""RetryTimer: an action run once its delay has passed, re-armed, cancelled
and closed at will, always on the timer's one thread."""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterator

import pytest

from kpng_py.runtime.retrytimer import RetryTimer

WAIT_SECONDS = 5
NEVER = 3600.0


class Runs:
    """The action: each run's thread, and an event per run."""

    def __init__(self, fail: bool = False) -> None:
        self.threads: list[threading.Thread] = []
        self.ran = threading.Semaphore(0)
        self._fail = fail

    def __call__(self) -> None:
        self.threads.append(threading.current_thread())
        self.ran.release()
        if self._fail:
            raise RuntimeError("the retry failed")

    def wait(self) -> None:
        assert self.ran.acquire(timeout=WAIT_SECONDS), "the action did not run"


@pytest.fixture
def runs() -> Runs:
    return Runs()


@pytest.fixture
def timer(runs: Runs) -> Iterator[RetryTimer]:
    timer = RetryTimer(runs, "test-retry")
    yield timer
    timer.close()


def test_the_action_runs_once_after_its_delay(timer: RetryTimer, runs: Runs) -> None:
    armed_at = time.monotonic()
    timer.arm(0.05)
    runs.wait()
    assert time.monotonic() - armed_at >= 0.05
    assert not timer.armed() and len(runs.threads) == 1


def test_every_run_is_on_one_thread(timer: RetryTimer, runs: Runs) -> None:
    for _ in range(3):
        timer.arm(0)
        runs.wait()
    assert len(set(runs.threads)) == 1 and runs.threads[0].name == "test-retry"


def test_a_new_arm_replaces_the_earlier_one(timer: RetryTimer, runs: Runs) -> None:
    timer.arm(NEVER)
    timer.arm(0)
    runs.wait()


def test_a_cancelled_timer_does_not_run(timer: RetryTimer, runs: Runs) -> None:
    timer.arm(0.05)
    timer.cancel()
    assert not timer.armed()
    assert not runs.ran.acquire(timeout=0.2)


def test_a_failed_run_is_logged_and_later_arms_still_run(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    runs = Runs(fail=True)
    timer = RetryTimer(runs, "failing-retry")
    try:
        timer.arm(0)
        runs.wait()
        timer.arm(0)
        runs.wait()
    finally:
        timer.close()
    failures = [r for r in caplog.records if r.getMessage() == "a timed retry failed"]
    assert len(failures) == 2 and failures[0].levelno == logging.ERROR


def test_close_waits_for_the_run_in_progress_and_later_arms_do_nothing() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow() -> None:
        started.set()
        release.wait(WAIT_SECONDS)
        finished.append(True)

    timer = RetryTimer(slow, "slow-retry")
    timer.arm(0)
    assert started.wait(WAIT_SECONDS)
    threading.Timer(0.1, release.set).start()
    timer.close()
    assert finished == [True]
    timer.arm(0)
    assert not timer.armed()
