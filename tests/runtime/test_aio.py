"""ThreadsafeEvent: set from any thread, awaited by tasks on any loop; and
running_task outside a task."""

from __future__ import annotations

import asyncio
import threading

from kpng_py.runtime.aio import ThreadsafeEvent, new_event_loop, running_task

WAIT_SECONDS = 5


def test_kpng_py_runs_on_uvloop() -> None:
    loop = new_event_loop()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()


def test_a_set_from_another_thread_wakes_tasks_on_two_loops() -> None:
    event = ThreadsafeEvent()
    waiting = threading.Barrier(3)
    woken: list[str] = []

    async def wait(name: str) -> None:
        waiter = asyncio.create_task(event.wait())
        await asyncio.sleep(0)  # the task is waiting now
        waiting.wait(WAIT_SECONDS)
        await asyncio.wait_for(waiter, WAIT_SECONDS)
        woken.append(name)

    threads = [threading.Thread(target=asyncio.run, args=(wait(name),)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    waiting.wait(WAIT_SECONDS)
    event.set()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert sorted(woken) == ["a", "b"] and event.is_set()


def test_a_wait_after_the_set_returns_at_once() -> None:
    event = ThreadsafeEvent()
    event.set()
    asyncio.run(asyncio.wait_for(event.wait(), WAIT_SECONDS))


def test_a_cancelled_waiter_is_forgotten_and_the_others_still_woken() -> None:
    async def main() -> bool:
        event = ThreadsafeEvent()
        cancelled = asyncio.create_task(event.wait())
        kept = asyncio.create_task(event.wait())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        threading.Thread(target=event.set).start()
        await asyncio.wait_for(kept, WAIT_SECONDS)
        return cancelled.cancelled()

    assert asyncio.run(main())


def test_a_set_for_a_waiter_whose_loop_is_closed_is_no_error() -> None:
    event = ThreadsafeEvent()
    loop = asyncio.new_event_loop()
    waiter = loop.create_task(event.wait())
    loop.run_until_complete(asyncio.sleep(0))
    waiter.cancel()  # never run again: its future stays among the waiters
    loop.close()
    event.set()
    assert event.is_set()


def test_running_task_in_a_task_is_that_task() -> None:
    async def main() -> bool:
        return running_task() is asyncio.current_task()

    assert asyncio.run(main())


def test_running_task_in_a_loop_callback_says_how_to_run_the_coroutine() -> None:
    loop = asyncio.new_event_loop()
    failures: list[str] = []

    def callback() -> None:
        try:
            running_task()
        except RuntimeError as err:
            failures.append(str(err))
        finally:
            loop.stop()

    loop.call_soon(callback)
    loop.run_forever()
    loop.close()
    assert len(failures) == 1 and "asyncio.create_task()" in failures[0]
