"""The HTTP calls `kpng-py kube` makes to the API server: a page of a list,
and a watch stream read event by event. urllib3 (docs/bench.md, "Listing
the Kubernetes API": the fastest and smallest of the clients measured),
with the JSON read by the standard library.

Every request carries the bearer token as its file says now; TCP
keepalives find a peer that went away without a word (a watch may
otherwise wait for its read timeout).
"""

from __future__ import annotations

import json
import socket
from contextlib import contextmanager
from typing import Any, Iterator
from urllib.parse import urlencode

import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import HTTPError

from kpng_py.brain.kube.access import ApiServerAccess
from kpng_py.brain.settings import KubeAccessError

GONE = 410
CONNECT_SECONDS = 10.0
LIST_READ_SECONDS = 60.0
# A watch is ended by the server after its timeoutSeconds; the client waits
# this much longer for the server's end before it gives up on the stream.
WATCH_GRACE_SECONDS = 30.0
_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
              (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 20),
              (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5),
              (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)]
_MESSAGE_CHARS = 300  # of an error's body, in messages


class ApiServerError(Exception):
    """A request to the API server failed; the message says which and why."""


class Expired(ApiServerError):
    """410 Gone: the resourceVersion is too old to watch from; list again."""


class ApiServerClient:
    """Lists and watches over one connection pool."""

    def __init__(self, access: ApiServerAccess) -> None:
        self._access = access
        self._pool = urllib3.PoolManager(
            num_pools=1, maxsize=4, retries=False,
            ssl_context=access.ssl_context() if access.url.startswith("https:") else None,
            socket_options=HTTPConnection.default_socket_options + _KEEPALIVE)

    @property
    def url(self) -> str:
        return self._access.url

    def get(self, path: str, query: dict[str, Any]) -> dict:
        """A JSON object (a list's page)."""
        with self._request(path, query, LIST_READ_SECONDS) as answer:
            return _json(answer.read(), path)

    @contextmanager
    def watch(self, path: str, query: dict[str, Any], seconds: int) -> Iterator[Iterator[dict]]:
        """The events of a watch (`watch=1`) that the server ends after
        `seconds`, each a JSON object as the server sends it."""
        with self._request(path, {**query, "watch": "1", "timeoutSeconds": seconds},
                           seconds + WATCH_GRACE_SECONDS) as answer:
            yield self._events(answer, path)

    def _events(self, answer: urllib3.BaseHTTPResponse, path: str) -> Iterator[dict]:
        try:
            for line in answer:
                if line.strip():
                    yield _json(line, path)
        except HTTPError as err:
            raise ApiServerError(f"watching {path} on {self.url}: {err}") from err

    @contextmanager
    def _request(self, path: str, query: dict[str, Any], read_seconds: float
                 ) -> Iterator[urllib3.BaseHTTPResponse]:
        url = f"{self.url}{path}?{urlencode(query)}"
        headers = {"Accept": "application/json"}
        try:
            authorization = self._access.authorization()
        except KubeAccessError as err:
            raise ApiServerError(str(err)) from err
        if authorization:
            headers["Authorization"] = authorization
        try:
            answer = self._pool.request(
                "GET", url, headers=headers, preload_content=False,
                timeout=urllib3.Timeout(connect=CONNECT_SECONDS, read=read_seconds))
        except HTTPError as err:
            raise ApiServerError(f"GET {path} on {self.url}: {err}") from err
        try:
            if answer.status != 200:
                raise _status_error(answer, path, self.url)
            yield answer
        finally:
            answer.release_conn()

    def close(self) -> None:
        self._pool.clear()


def _status_error(answer: urllib3.BaseHTTPResponse, path: str, url: str) -> ApiServerError:
    try:
        body = answer.read(64 << 10)
    except HTTPError:
        body = b""
    message = body.decode(errors="replace")
    try:
        message = json.loads(body).get("message", message)
    except (ValueError, AttributeError):
        pass
    problem = f"GET {path} on {url}: {answer.status} {message[:_MESSAGE_CHARS]}"
    if answer.status == GONE:
        return Expired(problem)
    if answer.status in (401, 403):
        problem += ("; kpng-py needs to list and watch services, nodes and "
                    "endpointslices.discovery.k8s.io, as the ClusterRole system:node-proxier "
                    "grants (deploy/kpng-py.yaml binds it): check the token and its binding")
    return ApiServerError(problem)


def _json(data: bytes, path: str) -> Any:
    try:
        value = json.loads(data)
    except ValueError as err:
        raise ApiServerError(f"GET {path}: the answer is not JSON ({err})") from err
    if not isinstance(value, dict):
        raise ApiServerError(f"GET {path}: the answer is not a JSON object")
    return value
