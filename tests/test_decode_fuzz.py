"""Arbitrary bytes from the brain never crash the decoder or the state model,
and messages near the gRPC size limit pass while larger ones are refused with
a hint naming the flag."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings, strategies as st

from kpng_py.api import localv1 as L
from kpng_py.client import ClientConfig
from kpng_py.decode import decode_endpoint, decode_service
from kpng_py.metrics import Metrics
from kpng_py.server import Reply
from kpng_py.skips import Skips
from kpng_py.state import NodeState
from tests.streams.build import port, reset, service, set_raw, set_service, sync
from tests.support.watch import RecordingSink, ScriptedSource, run_client, start

SKIPS = Skips(Metrics())


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_skipped(data: bytes) -> None:
    decode_service("default/fuzz", data, SKIPS)
    decode_endpoint("default/fuzz", "k", data, SKIPS)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 10, 11, 12, 77]),
                          st.sampled_from(["default/a", "default/a/k", "", "x/y/z/w", "a"]),
                          st.binary(max_size=60)), max_size=12))
def test_any_op_stream_is_applied_without_raising(items) -> None:
    state = NodeState(SKIPS)
    state.apply([reset()] + [set_raw(s, p, b) for s, p, b in items] + [sync()])


def big_service(size: int) -> L.OpItem:
    svc = service("big", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    svc.Annotations["filler"] = "x" * size
    return set_service(svc)


def test_messages_near_the_limit(tmp_path: Path) -> None:
    limit = 1 << 20
    near = Reply((reset(), big_service(limit - 200), sync()))
    source = ScriptedSource([near])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    sink.stop_after = 1
    try:
        run_client(ClientConfig(target, "n", max_msg_size=limit), sink, 20)
    finally:
        server.stop(0)
    assert len(sink.changesets) == 1

    over = Reply((reset(), big_service(limit + 10), sync()))
    source = ScriptedSource([over])
    server, target = start(source, tmp_path)
    sink = RecordingSink(source)
    try:
        run_client(ClientConfig(target, "n", max_msg_size=limit, error_delay=0.1), sink, 1)
    finally:
        server.stop(0)
    assert sink.changesets == []
    assert sink.errors and "raise --max-msg-size" in sink.errors[0]
