"""One kind of object of the API server, listed and watched into a store, as
client-go's reflector does:

- list, in pages (`limit`, `continue`), then watch from the list's
  resourceVersion with bookmarks (`allowWatchBookmarks`: the server tells a
  quiet watch's current resourceVersion, so that a new watch need not go
  back far);
- a watch the server ended (its `timeoutSeconds`) is opened again from the
  last resourceVersion seen;
- 410 Gone, as an answer or as an ERROR event (the resourceVersion is older
  than what the server keeps): list again, at once;
- any other failure (the server unreachable, an error answer, a broken
  stream): the API server counts as lost, and after a delay that doubles up
  to a cap, stretched at random (kpng_py.runtime.backoff), the store is listed
  again. A list replaces the store whole: what was deleted meanwhile goes.

The store keeps of each object only what the brain maps (no managedFields,
no annotations, a Node's metadata only).
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from kpng_py.brain.kube.client import ApiServerClient, ApiServerError, Expired
from kpng_py.runtime.backoff import Backoff
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

# A store: each object by "namespace/name" ("/name" for a Node).
Store = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Resource:
    name: str  # as the API names it: services, endpointslices, nodes
    path: str
    kept: tuple[str, ...]  # the top-level members kept of each object


SERVICES = Resource("services", "/api/v1/services", ("metadata", "spec", "status"))
ENDPOINT_SLICES = Resource("endpointslices", "/apis/discovery.k8s.io/v1/endpointslices",
                           ("metadata", "addressType", "endpoints", "ports"))
NODES = Resource("nodes", "/api/v1/nodes", ("metadata",))
_DROPPED_METADATA = ("managedFields", "annotations")


@dataclass(frozen=True)
class Timing:
    """How a reflector pages, watches and waits after a failure."""

    page: int = 500  # objects per page of a list (client-go's)
    # Each watch asks the server to end it after a time drawn in this range
    # (client-go's: 5 to 10 minutes), so that watches do not all end at once.
    watch_seconds: tuple[int, int] = (300, 600)
    error_delay: float = 1.0  # the first delay after a failure; doubles up to max_error_delay
    max_error_delay: float = 30.0


class Listener(Protocol):
    def changed(self) -> None:
        """The store changed (a list, or an event)."""

    def reached(self, resource: Resource) -> None:
        """A list of `resource` succeeded: the API server answers."""

    def lost(self, resource: Resource, problem: str) -> None:
        """A list or watch of `resource` failed."""


class Reflector:
    """Keeps the store of one resource; `run` until `stop` is set."""

    def __init__(self, client: ApiServerClient, resource: Resource, listener: Listener,
                 stop: threading.Event, timing: Timing = Timing(),
                 random_unit: Callable[[], float] = random.random) -> None:
        self.resource = resource
        self._client = client
        self._listener = listener
        self._stop = stop
        self._timing = timing
        self._random_unit = random_unit
        self._lock = threading.Lock()
        self._store: Store = {}
        self._version = ""  # the resourceVersion the store is at
        self.synced = threading.Event()  # set by the first list

    def snapshot(self) -> tuple[Store, str]:
        """The store as it is now (a copy: the reflector goes on changing its
        own) and the resourceVersion it is at: of its list, or of the last
        event or bookmark since."""
        with self._lock:
            return dict(self._store), self._version

    def run(self) -> None:
        timing = self._timing
        backoff = Backoff(timing.error_delay, timing.max_error_delay, self._random_unit)
        version: str | None = None
        expired_in_a_row = 0
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                    self._listener.reached(self.resource)
                version = self._watch(version)
                backoff.reset()  # a watch that lasted until the server ended it
                expired_in_a_row = 0
            except Expired as err:
                version = None
                expired_in_a_row += 1
                log.info("%s: the resourceVersion is too old to watch from; listing again",
                         self.resource.name, extra=fields(problem=str(err)))
                if expired_in_a_row > 1:  # a fresh list's version expired too: wait
                    self._stop.wait(backoff.next())
            except ApiServerError as err:
                version = None
                self._listener.lost(self.resource, str(err))
                self._stop.wait(backoff.next())

    def _list(self) -> str:
        """List the whole resource into the store; its resourceVersion."""
        objects: Store = {}
        query: dict[str, Any] = {"limit": self._timing.page}
        while True:
            page = self._client.get(self.resource.path, query)
            for obj in page.get("items") or []:
                objects[_key(obj)] = self._kept(obj)
            metadata = page.get("metadata") or {}
            if not metadata.get("continue"):
                break
            query = {"limit": self._timing.page, "continue": metadata["continue"]}
        version = str(metadata.get("resourceVersion", ""))
        with self._lock:
            self._store, self._version = objects, version
        self.synced.set()
        self._listener.changed()
        return version

    def _watch(self, version: str) -> str:
        """Apply the events of one watch from `version` until the server
        ends it (or `stop`); the last resourceVersion seen."""
        low, high = self._timing.watch_seconds
        seconds = low + int((high - low) * self._random_unit())
        query = {"resourceVersion": version, "allowWatchBookmarks": "true"}
        with self._client.watch(self.resource.path, query, seconds) as events:
            for event in events:
                version = self._apply(event, version)
                if self._stop.is_set():
                    break
        return version

    def _apply(self, event: dict[str, Any], version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            problem = f"watching {self.resource.name}: {obj.get('message', obj)}"
            raise (Expired if obj.get("code") == 410 else ApiServerError)(problem)
        metadata = obj.get("metadata") or {}
        version = str(metadata.get("resourceVersion", version))
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            log.warning("%s: a watch event of unknown type %r, ignored", self.resource.name,
                        kind, extra=fields(resource=self.resource.name))
            return version
        with self._lock:
            if kind == "DELETED":
                self._store.pop(_key(obj), None)
            elif kind != "BOOKMARK":
                self._store[_key(obj)] = self._kept(obj)
            self._version = version
        if kind != "BOOKMARK":
            self._listener.changed()
        return version

    def _kept(self, obj: dict[str, Any]) -> dict[str, Any]:
        kept = {member: obj[member] for member in self.resource.kept if member in obj}
        metadata = kept.get("metadata") or {}
        kept["metadata"] = {key: value for key, value in metadata.items()
                            if key not in _DROPPED_METADATA}
        return kept


def _key(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
