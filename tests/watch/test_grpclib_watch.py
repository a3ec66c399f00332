"""One Watch call on grpclib (WatchCall), against a scripted HTTP/2 brain
that sends exactly the given bytes: every whole message's bytes, in order,
then the brain's status; a bad length prefix, a cut message or a status
other than OK fail the call as CallFailed, after the messages before them."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from kpng_py.api import localv1 as L
from kpng_py.transport import TLSFiles
from kpng_py.watch.grpclib_watch import CallFailed, WatchCall, open_channel
from lab.localv1_servers import H2Brain, framed
from tests.streams.build import reset, sync

OK, UNAVAILABLE = 0, 14
MAX_MSG_SIZE = 1024
WAIT_SECONDS = 10
OPS = (reset(), sync())
MESSAGES = [op.SerializeToString() for op in OPS]


class _Ended(Exception):
    """Leaves the call once the brain ended the stream (WatchCall is only
    ever left by an exception)."""


async def _watch(target: str, got: list[bytes]) -> None:
    channel = open_channel(target, TLSFiles(), keepalive_time=WAIT_SECONDS,
                           keepalive_timeout=WAIT_SECONDS)
    try:
        async with WatchCall(channel, target, MAX_MSG_SIZE) as call:
            await call.send(L.WatchReq(NodeName="node-a"))
            while (messages := await call.next_messages()) is not None:
                got += messages
            raise _Ended
    except _Ended:
        pass
    finally:
        channel.close()


def watch(tmp_path: Path, payload: bytes, end_status: tuple[int, str] | None,
          frame_size: int = 1 << 14) -> tuple[list[bytes], CallFailed | None]:
    """The messages one call read from a brain sending `payload`, and how it failed."""
    brain = H2Brain(payload, frame_size, end_status)
    target = brain.start(tmp_path / "b.sock")
    got: list[bytes] = []
    try:
        asyncio.run(asyncio.wait_for(_watch(target, got), WAIT_SECONDS))
    except CallFailed as failure:
        return got, failure
    finally:
        brain.stop()
    return got, None


def prefix(compressed: bool, size: int) -> bytes:
    return struct.pack(">?I", compressed, size)


def test_every_message_then_the_end_with_ok(tmp_path: Path) -> None:
    assert watch(tmp_path, framed(*OPS), (OK, ""), frame_size=3) == (MESSAGES, None)


def test_the_brains_status_fails_the_call_with_its_details(tmp_path: Path) -> None:
    got, failure = watch(tmp_path, framed(*OPS), (UNAVAILABLE, "brain%20stopping"))
    assert got == MESSAGES and failure is not None
    assert (failure.status, failure.details, failure.local) == (
        "UNAVAILABLE", "brain stopping", False)


def test_a_status_that_is_no_grpc_status_is_the_brains_internal_error(tmp_path: Path) -> None:
    _, failure = watch(tmp_path, framed(*OPS), (99, ""))
    assert failure is not None and (failure.status, failure.local) == ("INTERNAL", False)
    assert "without a valid grpc-status (got '99')" in failure.details


@pytest.mark.parametrize("bad, details", [
    (prefix(False, MAX_MSG_SIZE + 1), f"over --max-msg-size ({MAX_MSG_SIZE} bytes)"),
    (prefix(True, 2) + b"\0\0", "a compressed message though none was negotiated"),
    (prefix(False, 10) + b"\0", "ended the stream in the middle of a message"),
])
def test_a_bad_message_fails_the_call_after_the_messages_before_it(
        tmp_path: Path, bad: bytes, details: str) -> None:
    got, failure = watch(tmp_path, framed(*OPS) + bad, (OK, ""))
    assert got == MESSAGES and failure is not None
    assert details in failure.details and failure.local
    assert failure.oversized == details.startswith("over --max-msg-size")


def test_no_brain_listening_fails_the_call_as_unavailable(tmp_path: Path) -> None:
    target = f"unix://{tmp_path / 'nobody.sock'}"
    got: list[bytes] = []
    with pytest.raises(CallFailed, match="UNAVAILABLE: cannot reach") as failure:
        asyncio.run(asyncio.wait_for(_watch(target, got), WAIT_SECONDS))
    assert failure.value.local and got == []
