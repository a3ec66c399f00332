"""Change sets per stream: Reset and the full view first, then differences in
KPNG's op order; no op for unchanged objects and no answer for no change."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
import yaml

from kpng_py.api import localv1
from kpng_py.brain.source import (
    PART_OPS,
    BrainSource,
    ChangeSetReply,
    StateSnapshots,
    changeset,
    changeset_specs,
)
from kpng_py.brain.statefile import ClusterState, StateReader, parse_state
from kpng_py.brain.view import node_view
from kpng_py.runtime.logs import record_fields
from kpng_py.serve.server import Reply
from tests.support.state_files import endpoint, op_kinds, port, service, state


def _state(*services: dict, nodes: list[dict] | None = None) -> ClusterState:
    return parse_state(yaml.safe_dump(state(*services, nodes=nodes)).encode(), "state.yaml")


def _kinds(reply: ChangeSetReply | tuple) -> list[str]:
    return op_kinds(reply.ops if isinstance(reply, ChangeSetReply) else reply)


WEB = service("web", ("10.96.0.10",), [port("http")], [
    endpoint("10.1.0.1", pod="web-0"), endpoint("10.1.0.2", pod="web-1")])
DB = service("db", ("10.96.0.20",), [port("pg", number=5432)], [
    endpoint("10.1.0.9", pod="db-0")])


def test_the_first_answer_is_reset_the_full_view_and_sync() -> None:
    view = node_view(_state(WEB, DB), "n1")
    assert _kinds(changeset(None, view)) == [
        "Reset", "Set services/default/db", "Set services/default/web",
        "Set endpoints/default/db/db-0", "Set endpoints/default/web/web-0",
        "Set endpoints/default/web/web-1", "Sync"]
    assert _kinds(changeset(None, {})) == ["Reset", "Sync"]


def test_differences_come_in_kpngs_op_order() -> None:
    before = node_view(_state(WEB, DB), "n1")
    web = service("web", ("10.96.0.11",), [port("http")], [
        endpoint("10.1.0.1", pod="web-0"), endpoint("10.1.0.3", pod="web-2")])
    cache = service("cache", ("10.96.0.30",), [port("redis", number=6379)], [
        endpoint("10.1.0.7", pod="cache-0")])
    after = node_view(_state(web, cache), "n1")
    assert _kinds(changeset(before, after)) == [
        "Set services/default/cache", "Set services/default/web",
        "Delete endpoints/default/db/db-0", "Delete endpoints/default/web/web-1",
        "Set endpoints/default/cache/cache-0", "Set endpoints/default/web/web-2",
        "Delete services/default/db", "Sync"]


def test_no_difference_is_no_change_set() -> None:
    view = node_view(_state(WEB), "n1")
    assert changeset(view, node_view(_state(WEB), "n1")) == ()
    assert changeset({}, {}) == ()


class _Session:
    """One stream of a BrainSource, asked as the server asks it (for an answer
    that is there already)."""

    def __init__(self, snapshots: StateSnapshots) -> None:
        self._session = BrainSource(snapshots).open_stream()

    def next(self, node: str) -> ChangeSetReply:
        return asyncio.run(asyncio.wait_for(self._session.next_reply(node), 10))


def test_versions_published_meanwhile_merge_into_one_change_set() -> None:
    snapshots = StateSnapshots(_state(WEB))
    stream = _Session(snapshots)
    stream.next("n1")
    snapshots.publish(_state(WEB, DB))
    snapshots.publish(_state(DB))
    assert _kinds(stream.next("n1")) == [
        "Set services/default/db", "Delete endpoints/default/web/web-0",
        "Delete endpoints/default/web/web-1", "Set endpoints/default/db/db-0",
        "Delete services/default/web", "Sync"]


def test_a_version_that_does_not_change_the_nodes_view_is_not_answered() -> None:
    """Node n1 is told nothing about an endpoint it cannot use: the stream
    keeps waiting, and answers with the next real change only."""
    nodes = [{"name": "n1", "topology": {"zone": "z1"}}]
    snapshots = StateSnapshots(_state(WEB, nodes=nodes))
    stream = _Session(snapshots)
    stream.next("n1")
    both = {"zones": ["z1", "z2"]}  # hints change no endpoint's bytes
    for_z2 = service("web", ("10.96.0.10",), [port("http")], [
        endpoint("10.1.0.1", pod="web-0", hints=both),
        endpoint("10.1.0.2", pod="web-1", hints=both),
        endpoint("10.1.0.3", pod="web-z2", hints={"zones": ["z2"]})])
    assert snapshots.publish(_state(for_z2, nodes=nodes))
    assert not snapshots.publish(_state(for_z2, nodes=nodes))  # the same state: no version
    snapshots.publish(_state(for_z2, DB, nodes=nodes))
    assert _kinds(stream.next("n1")) == [
        "Set services/default/db", "Set endpoints/default/db/db-0", "Sync"]


def test_each_version_a_stream_answers_is_logged_at_debug_with_its_ops(
        caplog: pytest.LogCaptureFixture) -> None:
    """What says which version a node is at once its change set (if any
    ops) is applied: `kpng-py kube to-local -v` logs it before the change
    set's `sync applied` (the e2e harness waits for it)."""
    caplog.set_level(logging.DEBUG, logger="kpng_py.brain.source")
    nodes = [{"name": "n1", "topology": {"zone": "z1"}}]
    snapshots = StateSnapshots(_state(WEB, nodes=nodes))
    session = BrainSource(snapshots).open_stream()
    hinted = service("web", ("10.96.0.10",), [port("http")], [
        endpoint("10.1.0.1", pod="web-0", hints={"zones": ["z1"]}),
        endpoint("10.1.0.2", pod="web-1", hints={"zones": ["z1"]})])

    async def answers() -> None:
        await session.next_reply("n1")
        waiting = asyncio.ensure_future(session.next_reply("n1"))
        await asyncio.sleep(0.05)
        snapshots.publish(_state(hinted, nodes=nodes))  # the same view for n1
        await asyncio.sleep(0.05)
        assert not waiting.done()
        snapshots.publish(_state(hinted, DB, nodes=nodes))
        await asyncio.wait_for(waiting, 10)

    asyncio.run(answers())
    answered = [record_fields(r) for r in caplog.records
                if r.getMessage() == "node view answered"]
    assert answered == [{"node": "n1", "version": 1, "ops": 5},
                        {"node": "n1", "version": 2, "ops": 0},
                        {"node": "n1", "version": 3, "ops": 3}]


def test_a_stream_that_changes_node_name_gets_the_difference_of_the_views() -> None:
    web = service("web", ("10.96.0.10",), [port("http")], [
        endpoint("10.1.0.1", pod="web-0", node="n1"), endpoint("10.1.0.2", pod="web-1")],
        internaltraffictolocal=True, externaltraffictolocal=True)
    snapshots = StateSnapshots(_state(web))
    stream = _Session(snapshots)
    assert "Set endpoints/default/web/web-0" in _kinds(stream.next("n1"))
    assert _kinds(stream.next("n2")) == ["Delete endpoints/default/web/web-0", "Sync"]


def test_a_waiting_stream_is_woken_by_a_version_published_from_another_thread() -> None:
    snapshots = StateSnapshots(_state(WEB))
    session = BrainSource(snapshots).open_stream()

    async def answers() -> tuple[ChangeSetReply, ChangeSetReply]:
        first = await session.next_reply("n1")
        waiting = asyncio.ensure_future(session.next_reply("n1"))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # nothing new: no answer
        publisher = asyncio.get_running_loop().run_in_executor(
            None, snapshots.publish, _state(WEB, DB))
        second = await asyncio.wait_for(waiting, 10)
        assert await publisher
        return first, second

    first, second = asyncio.run(answers())
    assert _kinds(first)[0] == "Reset"
    assert _kinds(second) == ["Set services/default/db", "Set endpoints/default/db/db-0", "Sync"]


def test_a_waiting_stream_ends_when_its_task_is_cancelled() -> None:
    snapshots = StateSnapshots(_state(WEB))
    session = BrainSource(snapshots).open_stream()

    async def cancel_a_wait() -> None:
        await session.next_reply("n1")
        waiting = asyncio.ensure_future(session.next_reply("n1"))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(cancel_a_wait())
    assert snapshots.publish(_state(DB))  # nobody waits any more: nothing to wake


def test_streams_of_one_node_share_its_view() -> None:
    snapshots = StateSnapshots(_state(WEB))
    first, second = _Session(snapshots), _Session(snapshots)
    assert first.next("n1").ops == second.next("n1").ops
    version, view = snapshots.current_view("n1")
    assert snapshots.current_view("n1") == (version, view)
    assert snapshots.current_view("n1")[1] is view
    assert asyncio.run(snapshots.wait_view("n1", None))[1] is view


def test_a_one_endpoint_edit_of_a_big_file_is_one_op_and_sync() -> None:
    """1000 services of 3 endpoints, as a generator writes them; one endpoint
    moves to a new address, then one goes: each edit is published as one op
    and Sync, and the reload reads the edited service only."""
    services = [service(f"svc-{i}", (f"10.96.{i // 250}.{i % 250 + 1}",), [port("http")],
                        [endpoint(f"10.{j + 1}.{i // 250}.{i % 250 + 1}", pod=f"p{j}")
                         for j in range(3)])
                for i in range(1000)]
    text = yaml.dump(state(*services), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
    reader = StateReader("state.yaml")
    loaded = reader.read(text.encode())
    snapshots = StateSnapshots(loaded)
    stream = _Session(snapshots)
    first = _kinds(stream.next("n1"))
    assert (first[0], first[-1], len(first)) == ("Reset", "Sync", 1 + 1000 * 4 + 1)

    moved = text.replace("- 10.2.2.1\n", "- 10.9.9.9\n")
    assert moved.count("10.9.9.9") == 1
    edited = reader.read(moved.encode())
    assert [a is b for a, b in zip(loaded.services, edited.services)].count(False) == 1
    assert edited == parse_state(moved.encode(), "state.yaml")
    assert snapshots.publish(edited)
    assert _kinds(stream.next("n1")) == ["Set endpoints/default/svc-500/p1", "Sync"]

    gone, removed = re.subn(r"  - endpoint:\n      ips:\n        v4:\n        - 10\.9\.9\.9\n"
                            r"(?:    .*\n)+?    podname: p1\n    topology:\n      node: ''\n",
                            "", moved)
    assert removed == 1
    assert snapshots.publish(reader.read(gone.encode()))
    assert _kinds(stream.next("n1")) == ["Delete endpoints/default/svc-500/p1", "Sync"]


def test_streams_of_one_node_get_the_same_answer_serialized_once() -> None:
    """Per node and state version the answer is built once: the streams that
    were last sent the same version (or nothing) get the same reply, and so
    the same serialized bytes (`wire` is computed once per reply)."""
    snapshots = StateSnapshots(_state(WEB))
    a, b, c, other_node = (_Session(snapshots) for _ in range(4))
    first = a.next("n1")
    assert b.next("n1") is first
    assert other_node.next("n2") is not first
    snapshots.publish(_state(WEB, DB))
    step = a.next("n1")
    assert b.next("n1") is step
    assert _kinds(step) == ["Set services/default/db", "Set endpoints/default/db/db-0", "Sync"]
    late = c.next("n1")  # its first answer: the whole of version 2, not the difference
    assert late is not step and _kinds(late)[0] == "Reset"
    assert _Session(snapshots).next("n1") is late
    snapshots.publish(_state(DB))
    after_a, after_c = a.next("n1"), c.next("n1")
    assert after_a is after_c  # both had version 2, one as a difference, one whole
    assert _kinds(after_a) == [
        "Delete endpoints/default/web/web-0", "Delete endpoints/default/web/web-1",
        "Delete services/default/web", "Sync"]


def test_the_written_wire_is_the_replys_ops_for_every_kind_of_op() -> None:
    """A reply's wire, serialized from its specs in parts, is its OpItems'
    gRPC messages, message for message (Reset, Set with and without bytes,
    Delete, Sync; long paths and values)."""
    long_name = "s" * 200
    before = node_view(_state(WEB, DB), "n1")
    after = node_view(_state(DB, service(long_name, ("10.96.0.30",), [port("http")], [
        endpoint(*(f"10.2.{i // 250}.{i % 250}" for i in range(40)), pod="big")])), "n1")
    after[(localv1.EndpointsSet, "default/db/empty")] = b""
    for sent, view in ((None, before), (before, after), (after, before), (None, after)):
        specs = changeset_specs(sent, view)
        reply = ChangeSetReply(specs)
        assert reply.ops == changeset(sent, view)
        assert reply.wire == Reply(reply.ops).wire
    assert any(len(data) > 0x7F for _, _, data in changeset_specs(None, after))


def test_a_big_reply_is_written_in_parts_serialized_once_for_all_its_streams() -> None:
    """A first answer of more than PART_OPS ops comes in parts of PART_OPS
    ops: together protobuf's bytes; each part serialized when the first
    stream asks for it, and the same bytes object for a stream that asks
    later or at the same time."""
    big = service("big", ("10.96.0.40",), [port("http")], [
        endpoint(f"10.3.{i // 250}.{i % 250}", pod=f"p{i}") for i in range(PART_OPS + 10)])
    reply = ChangeSetReply(changeset_specs(None, node_view(_state(big), "n1")))
    first, second = reply.wire_parts(), reply.wire_parts()
    parts = [next(first)]
    assert next(second) is parts[0]  # the second stream waits for nothing built
    parts += list(first)
    later = list(reply.wire_parts())
    assert [id(part) for part in [parts[0], *second]] == [id(part) for part in parts]
    assert [id(part) for part in later] == [id(part) for part in parts]
    assert len(parts) == 2  # Reset, the service, PART_OPS + 10 endpoints, Sync
    assert b"".join(parts) == reply.wire == Reply(reply.ops).wire
    assert parts[0] == Reply(reply.ops[:PART_OPS]).wire


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kpng_py.brain.source" and r.levelname == "WARNING"]


def test_a_node_the_state_does_not_list_is_warned_about_once_per_version(
        caplog: pytest.LogCaptureFixture) -> None:
    nodes = [{"name": f"n{i}"} for i in range(12)]
    snapshots = StateSnapshots(_state(WEB, nodes=nodes))
    for _ in range(2):  # a second stream, or a second look, of the same version
        snapshots.current_view("nope")
        snapshots.current_view("n1")
    assert _warnings(caplog) == [
        "node 'nope' is not one of the state file's nodes (n0, n1, n2, n3, n4, n5, n6, n7, n8, "
        "n9 and 2 more); check its --node-name (a node the file does not list has no zone: "
        "zone hints do not narrow its view)"]
    assert not snapshots.publish(_state(WEB, nodes=nodes))  # the file read again, unchanged
    snapshots.current_view("nope")
    assert len(_warnings(caplog)) == 1
    assert snapshots.publish(_state(WEB, DB, nodes=nodes))  # a new version
    snapshots.current_view("nope")
    assert len(_warnings(caplog)) == 2


def test_a_state_without_nodes_warns_about_none(caplog: pytest.LogCaptureFixture) -> None:
    StateSnapshots(_state(WEB)).current_view("any")
    assert _warnings(caplog) == []
