"""The brain's side of localv1 Watch streams: a versioned snapshot of the
cluster state, and per stream what was last sent.

Each WatchReq is answered with the difference between the node's current view
and what this stream last sent, in KPNG's op order: Set services; Delete
endpoints; Set endpoints; Delete services (a service is Set before its
endpoints and deleted after them). The first answer of a stream is Reset and
the whole view. Unchanged objects produce no op, and a difference with no op
produces no answer: the stream waits for the next version. Versions published
while a client is busy applying are merged into its next answer.

Answers are shared: the streams of one node that were last sent the same
version (or nothing yet) get the same Reply for the current version, built
and serialized once. At debug level, each version a stream answers is logged
with its node and its count of ops (0: nothing to send).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterator

from kpng_py.api import localv1
from kpng_py.brain.statefile import ClusterState
from kpng_py.brain.view import NodeView, Ref, node_view
from kpng_py.runtime.aio import ThreadsafeEvent
from kpng_py.runtime.logs import fields
from kpng_py.serve.server import MESSAGE_PREFIX

log = logging.getLogger(__name__)

# The state's node names a warning about a node it does not list names.
_NODES_NAMED = 10
# What a stream was last sent (the node and version of that view; None:
# nothing yet), the node it asks for and the current version.
ReplyKey = tuple[tuple[str, int] | None, str, int]


class StateSnapshots:
    """The current ClusterState and its version; per node, its view is computed
    once per version and shared by every stream of that node.

    The watcher thread publishes; streams wait on an event loop, woken when
    their version is superseded."""

    def __init__(self, state: ClusterState) -> None:
        self._lock = threading.Lock()
        self._state = state
        self._version = 1
        self._views: dict[str, NodeView] = {}
        self._replies: dict[ReplyKey, ChangeSetReply] = {}  # for the current version
        self._superseded = ThreadsafeEvent()  # set when the version changes

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def publish(self, state: ClusterState) -> bool:
        """Make `state` current; False (and no new version) if nothing changed."""
        with self._lock:
            if state == self._state:
                return False
            self._state = state
            self._version += 1
            self._views.clear()
            self._replies.clear()
            superseded, self._superseded = self._superseded, ThreadsafeEvent()
        superseded.set()
        return True

    def current_view(self, node_name: str) -> tuple[int, NodeView]:
        """The version and the node's view of it. A node the state does
        not list is warned about when its view of a version is computed:
        once per version, whatever the number of its streams."""
        with self._lock:
            version, state, view = self._version, self._state, self._views.get(node_name)
            computed = view is None
            if view is None:
                view = self._views[node_name] = node_view(state, node_name)
        if computed:
            _warn_if_unlisted(state, node_name, version)
        return version, view

    def shared_reply(self, key: ReplyKey,
                     build: Callable[[], ChangeSetReply]) -> ChangeSetReply:
        """The reply for `key`, built (by `build`) once while its version is
        current, and the same object for every stream that asks for it."""
        with self._lock:
            reply = self._replies.get(key)
        if reply is None:
            reply = build()  # outside the lock: a publish need not wait for it
            with self._lock:
                if key[2] == self._version:
                    reply = self._replies.setdefault(key, reply)
        return reply

    async def wait_view(self, node_name: str, seen_version: int | None) -> tuple[int, NodeView]:
        """The node's view once the version differs from `seen_version`."""
        while True:
            with self._lock:
                changed = self._version != seen_version
                superseded = self._superseded
            if changed:
                return self.current_view(node_name)
            await superseded.wait()


def _warn_if_unlisted(state: ClusterState, node_name: str, version: int) -> None:
    """One warning if the state lists nodes and `node_name` is not one of
    them (a state without nodes has none to check against)."""
    names = [node.name for node in state.nodes]
    if not names or node_name in names:
        return
    shown = ", ".join(names[:_NODES_NAMED])
    if len(names) > _NODES_NAMED:
        shown += f" and {len(names) - _NODES_NAMED} more"
    log.warning("node %r is not one of the state file's nodes (%s); check its --node-name "
                "(a node the file does not list has no zone: zone hints do not narrow its view)",
                node_name, shown,
                extra=fields(node=node_name, nodes=len(names), version=version))


class BrainSource:
    """A ChangeSetSource serving the snapshots' state to every stream."""

    def __init__(self, snapshots: StateSnapshots) -> None:
        self._snapshots = snapshots

    def open_stream(self) -> BrainSession:
        return BrainSession(self._snapshots)


class BrainSession:
    """One Watch stream: what it last sent, and for which node and version."""

    def __init__(self, snapshots: StateSnapshots) -> None:
        self._snapshots = snapshots
        self._sent: NodeView | None = None  # None until the first answer
        self._sent_as: tuple[str, int] | None = None  # that view's node and version
        self._answered: tuple[str, int] | None = None

    async def next_reply(self, node_name: str) -> ChangeSetReply:
        while True:
            seen = self._answered[1] if self._answered and self._answered[0] == node_name \
                else None
            version, view = await self._snapshots.wait_view(node_name, seen)
            self._answered = (node_name, version)
            sent = self._sent
            reply = self._snapshots.shared_reply(
                (self._sent_as, node_name, version),
                lambda: ChangeSetReply(changeset_specs(sent, view)))
            if log.isEnabledFor(logging.DEBUG):
                # The stream's node is at `version` once this reply (if any ops) is applied.
                log.debug("node view answered", extra=fields(node=node_name, version=version,
                                                               ops=len(reply.specs)))
            if reply.specs:
                self._sent = view  # views are never modified once computed
                self._sent_as = self._answered
                return reply

    def close(self) -> None:
        self._sent = None
        self._sent_as = None


# One op of a change set: Set (a ref and its value), Delete (a ref), Reset or
# Sync (neither), as plain values until a reply is serialized or an
# in-process sink takes its OpItems.
SET, DELETE, RESET, SYNC = range(4)
OpSpec = tuple[int, Ref | None, bytes]


# Ops per part of a reply's wire: a part (about 150 KB at 10 000 services,
# near a Unix socket's buffer) is written while the next one is serialized.
PART_OPS = 2048


@dataclass(frozen=True)
class ChangeSetReply:
    """A change set as a Reply: its wire serialized in parts from the specs,
    its OpItems only when asked for."""

    specs: tuple[OpSpec, ...]
    close_reason: str | None = None
    # The wire's parts serialized so far, shared by every stream sent this reply.
    _parts: list[bytes] = field(default_factory=list, init=False, repr=False, compare=False)
    _serializing: threading.Lock = field(default_factory=threading.Lock, init=False,
                                         repr=False, compare=False)

    @cached_property
    def ops(self) -> tuple[localv1.OpItem, ...]:
        return tuple(map(_op_item, self.specs))

    @cached_property
    def wire(self) -> bytes:
        return b"".join(self.wire_parts())

    def wire_parts(self) -> Iterator[bytes]:
        """The wire, PART_OPS ops a part, each serialized when it is first
        asked for: the first streams to ask wait for the first part only."""
        for index in range(0, len(self.specs), PART_OPS):
            part_index = index // PART_OPS
            with self._serializing:
                if part_index == len(self._parts):
                    self._parts.append(b"".join(
                        map(_op_message, self.specs[index:index + PART_OPS])))
                part = self._parts[part_index]
            yield part


def changeset(sent: NodeView | None, view: NodeView) -> tuple[localv1.OpItem, ...]:
    """The ops that take a client from `sent` (None: nothing yet) to `view`,
    ending in Sync; empty when there is no difference to send."""
    return ChangeSetReply(changeset_specs(sent, view)).ops


def changeset_specs(sent: NodeView | None, view: NodeView) -> tuple[OpSpec, ...]:
    """`changeset`'s ops as specs."""
    if sent is None:  # everything, services first: ServicesSet < EndpointsSet
        return ((RESET, None, b""), *[(SET, ref, view[ref]) for ref in sorted(view)],
                (SYNC, None, b""))
    previous: NodeView = sent
    changed = sorted(ref for ref, value in view.items() if previous.get(ref) != value)
    gone = sorted(ref for ref in previous if ref not in view)
    if not changed and not gone:
        return ()

    def sets(of: int) -> list[OpSpec]:
        return [(SET, ref, view[ref]) for ref in changed if ref[0] == of]

    def deletes(of: int) -> list[OpSpec]:
        return [(DELETE, ref, b"") for ref in gone if ref[0] == of]

    return tuple(sets(localv1.ServicesSet) + deletes(localv1.EndpointsSet)
                 + sets(localv1.EndpointsSet) + deletes(localv1.ServicesSet)
                 + [(SYNC, None, b"")])


def _op_item(spec: OpSpec) -> localv1.OpItem:
    kind, ref, data = spec
    op = localv1.OpItem()
    if ref is None:  # Reset or Sync
        (op.Reset if kind == RESET else op.Sync).SetInParent()
    elif kind == SET:
        value = op.Set  # written in place: nested constructors copy each sub-message
        value.Ref.Set, value.Ref.Path = ref
        value.Bytes = data
    else:
        op.Delete.Set, op.Delete.Path = ref
    return op


def _op_message(spec: OpSpec) -> bytes:
    """One op as a gRPC message of the stream: its prefix (not compressed,
    its length) and the OpItem's bytes."""
    body = _op_item(spec).SerializeToString()
    return MESSAGE_PREFIX.pack(0, len(body)) + body
