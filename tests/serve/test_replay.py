"""ReplaySource: each node name gets the recording's segments once, in
order, a disconnect as its stream's failure; then a quiet open stream."""

from __future__ import annotations

import asyncio

import pytest

from kpng_py.serve.recording import Segment
from kpng_py.serve.replay import ReplaySource
from tests.streams.build import reset, sync

FIRST = Segment((reset(), sync()))
CUT = Segment((), disconnect="UNAVAILABLE: brain stopped")
LAST = Segment((sync(),))


def test_each_node_replays_the_whole_recording_once_in_order() -> None:
    source = ReplaySource([FIRST, CUT, LAST])
    for node in ("node-a", "node-b"):
        replies = [source.take(node) for _ in range(4)]
        assert [(r.ops, r.close_reason) if r else None for r in replies] == [
            (FIRST.ops, None), ((), "UNAVAILABLE: brain stopped"), (LAST.ops, None), None]


def test_a_recorded_change_set_is_one_reply_for_every_node() -> None:
    source = ReplaySource([FIRST])
    assert source.take("node-a") is source.take("node-b")


def test_a_new_stream_goes_on_where_the_nodes_last_one_stopped() -> None:
    source = ReplaySource([FIRST, CUT, LAST])

    async def next_ops(node: str) -> tuple:
        session = source.open_stream()
        try:
            return (await session.next_reply(node)).ops
        finally:
            session.close()

    assert asyncio.run(next_ops("node-a")) == FIRST.ops
    source.take("node-a")  # the stream failed after the recorded disconnect
    assert asyncio.run(next_ops("node-a")) == LAST.ops


def test_an_exhausted_recording_keeps_the_stream_open_and_quiet() -> None:
    session = ReplaySource([]).open_stream()
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(session.next_reply("node-a"), 0.1))
