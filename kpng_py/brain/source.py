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
and serialized once.
"""

from __future__ import annotations

import threading
from typing import Callable

from kpng_py.aio import ThreadsafeEvent
from kpng_py.api import localv1
from kpng_py.brain.statefile import ClusterState
from kpng_py.brain.view import NodeView, Ref, node_view
from kpng_py.server import Reply

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
        self._replies: dict[ReplyKey, Reply] = {}  # for the current version
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
        """The version and the node's view of it."""
        with self._lock:
            view = self._views.get(node_name)
            if view is None:
                view = self._views[node_name] = node_view(self._state, node_name)
            return self._version, view

    def shared_reply(self, key: ReplyKey, build: Callable[[], Reply]) -> Reply:
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

    async def next_reply(self, node_name: str) -> Reply:
        while True:
            seen = self._answered[1] if self._answered and self._answered[0] == node_name \
                else None
            version, view = await self._snapshots.wait_view(node_name, seen)
            self._answered = (node_name, version)
            sent = self._sent
            reply = self._snapshots.shared_reply((self._sent_as, node_name, version),
                                                 lambda: Reply(changeset(sent, view)))
            if reply.ops:
                self._sent = view  # views are never modified once computed
                self._sent_as = self._answered
                return reply

    def close(self) -> None:
        self._sent = None
        self._sent_as = None


def changeset(sent: NodeView | None, view: NodeView) -> tuple[localv1.OpItem, ...]:
    """The ops that take a client from `sent` (None: nothing yet) to `view`,
    ending in Sync; empty when there is no difference to send."""
    previous: NodeView = sent or {}
    changed = sorted(ref for ref, value in view.items() if previous.get(ref) != value)
    gone = sorted(ref for ref in previous if ref not in view)
    if sent is not None and not changed and not gone:
        return ()

    def sets(of: int) -> list[localv1.OpItem]:
        return [_set(ref, view[ref]) for ref in changed if ref[0] == of]

    def deletes(of: int) -> list[localv1.OpItem]:
        return [localv1.OpItem(Delete=_ref(ref)) for ref in gone if ref[0] == of]

    reset = [localv1.OpItem(Reset=localv1.EmptyOp())] if sent is None else []
    return tuple(reset + sets(localv1.ServicesSet) + deletes(localv1.EndpointsSet)
                 + sets(localv1.EndpointsSet) + deletes(localv1.ServicesSet)
                 + [localv1.OpItem(Sync=localv1.EmptyOp())])


def _ref(ref: Ref) -> localv1.Ref:
    return localv1.Ref(Set=ref[0], Path=ref[1])


def _set(ref: Ref, data: bytes) -> localv1.OpItem:
    """A Set op, written in place (a third faster than nested constructors,
    which copy each sub-message: 110 000 of them in a first answer)."""
    op = localv1.OpItem()
    value = op.Set
    value.Ref.Set, value.Ref.Path = ref
    value.Bytes = data
    return op
