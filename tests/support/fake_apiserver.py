"""A Kubernetes API server's list and watch, on loopback, for the tests of
`kpng-py kube`: paged lists with a resourceVersion, watches from one (with
bookmarks on demand), 410 Gone for a version older than it keeps (as an
answer or as an ERROR event, as real servers send either), and outages
(every request answered 503, open watches cut) until it is back.

Objects are kept as given (JSON-ready dicts); every change has the next
resourceVersion, as etcd's revision.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

PATHS = {"services": "/api/v1/services",
         "endpointslices": "/apis/discovery.k8s.io/v1/endpointslices",
         "nodes": "/api/v1/nodes"}
_RESOURCES = {path: name for name, path in PATHS.items()}


@dataclass
class _Event:
    version: int
    resource: str
    type: str
    obj: dict[str, Any]


@dataclass
class FakeApiServer:
    """`start`, change objects (`put`, `delete`), `bookmark`, `forget`
    (compaction), `down`/`up`; `stop`."""

    expired_as_event: bool = True  # a watch too old: an ERROR event (else an HTTP 410)
    version: int = 100
    objects: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {name: {} for name in PATHS})
    requests: list[str] = field(default_factory=list)  # "list services", "watch nodes@7"...
    _events: list[_Event] = field(default_factory=list)
    _oldest: int = 0  # a watch from an older version is too old
    _available: bool = True
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeApiServer:
        fake = self

        class Handler(_Handler):
            server_state = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.down()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- the objects

    def put(self, resource: str, obj: dict[str, Any]) -> None:
        with self._changed:
            self.version += 1
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
            key = _key(obj)
            kind = "MODIFIED" if key in self.objects[resource] else "ADDED"
            self.objects[resource][key] = obj
            self._events.append(_Event(self.version, resource, kind, obj))
            self._changed.notify_all()

    def delete(self, resource: str, namespace: str, name: str) -> None:
        with self._changed:
            self.version += 1
            obj = self.objects[resource].pop(f"{namespace}/{name}")
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
            self._events.append(_Event(self.version, resource, "DELETED", obj))
            self._changed.notify_all()

    def bookmark(self, resource: str) -> None:
        """A BOOKMARK event on the resource's watches, at the current version."""
        with self._changed:
            self.version += 1
            self._events.append(_Event(self.version, resource, "BOOKMARK",
                                       {"metadata": {"resourceVersion": str(self.version)}}))
            self._changed.notify_all()

    def forget(self) -> None:
        """A write elsewhere, then a compaction of every event: a watch
        from any version seen so far is too old (a new list's is not)."""
        with self._changed:
            self.version += 1
            self._oldest = self.version
            self._events.clear()
            self._changed.notify_all()

    def down(self) -> None:
        with self._changed:
            self._available = False
            self._changed.notify_all()

    def up(self) -> None:
        with self._changed:
            self._available = True

    def wait_for_request(self, prefix: str, count: int = 1, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while sum(r.startswith(prefix) for r in self.requests) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {count} requests {prefix!r}: {self.requests}")
            time.sleep(0.01)

    # -- what the handler asks

    def page(self, resource: str, limit: int, offset: int) -> tuple[int, list, int | None]:
        with self._changed:
            items = [self.objects[resource][key] for key in sorted(self.objects[resource])]
            more = offset + limit < len(items) if limit else False
            return self.version, items[offset:offset + limit if limit else None], (
                offset + limit if more else None)

    def events(self, resource: str, since: int, seconds: float) -> Iterator[_Event | None]:
        """The events after `since` as they come, until `seconds` passed;
        None ends the stream cut short (the server went down)."""
        deadline = time.monotonic() + seconds
        while True:
            with self._changed:
                if not self._available:
                    yield None
                    return
                if since < self._oldest:
                    yield _Event(0, resource, "ERROR", {
                        "kind": "Status", "code": 410, "reason": "Expired",
                        "message": f"too old resource version: {since} ({self._oldest})"})
                    return
                fresh = [e for e in self._events if e.version > since and e.resource == resource]
                if not fresh:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._changed.wait(min(left, 0.05))
                    continue
            for event in fresh:
                since = event.version
                yield event

    def available(self) -> bool:
        with self._changed:
            return self._available

    def too_old(self, since: int) -> bool:
        with self._changed:
            return since < self._oldest


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        fake = self.server_state
        url = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        resource = _RESOURCES.get(url.path)
        if resource is None:
            return self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})
        watching = query.get("watch") in ("1", "true")
        since = int(query.get("resourceVersion") or 0)
        fake.requests.append(f"watch {resource}@{since}" if watching else f"list {resource}")
        if not fake.available():
            return self._answer(503, {"kind": "Status", "code": 503, "message": "unavailable"})
        if not watching:
            version, items, more = fake.page(resource, int(query.get("limit") or 0),
                                             int(query.get("continue") or 0))
            return self._answer(200, {"kind": "List", "items": items, "metadata": {
                "resourceVersion": str(version), **({"continue": str(more)} if more else {})}})
        if not fake.expired_as_event and fake.too_old(since):
            return self._answer(410, {"kind": "Status", "code": 410, "message": "too old"})
        self._watch(resource, since, float(query.get("timeoutSeconds") or 60))

    def _watch(self, resource: str, since: int, seconds: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in self.server_state.events(resource, since, seconds):
            if event is None:  # cut: no last chunk
                self.close_connection = True
                return
            line = json.dumps({"type": event.type, "object": event.obj}).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _key(obj: dict[str, Any]) -> str:
    metadata = obj["metadata"]
    return f"{metadata.get('namespace', '')}/{metadata['name']}"
