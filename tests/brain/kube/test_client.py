"""The API server's HTTP calls (kpng_py/brain/kube/client.py) against
servers on loopback: pages and watch events as JSON objects, and errors that
say which request failed and why."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from kpng_py.brain.kube.access import ApiServerAccess
from kpng_py.brain.kube.client import ApiServerClient, ApiServerError, Expired
from tests.support.fake_apiserver import PATHS, FakeApiServer
from tests.support.kube_objects import api_service

SERVICES = PATHS["services"]


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer(expired_as_event=False).start()
    server.put("services", api_service("web", "10.96.0.10"))
    yield server
    server.stop()


@pytest.fixture
def client(fake: FakeApiServer) -> Iterator[ApiServerClient]:
    client = ApiServerClient(ApiServerAccess(fake.url))
    yield client
    client.close()


def test_a_page_is_the_servers_json_object(fake: FakeApiServer, client: ApiServerClient) -> None:
    page = client.get(SERVICES, {"limit": 10})
    assert [item["metadata"]["name"] for item in page["items"]] == ["web"]
    assert page["metadata"]["resourceVersion"] == str(fake.version)


def test_a_watch_gives_each_event_until_the_server_ends_it(
        fake: FakeApiServer, client: ApiServerClient) -> None:
    since = fake.version
    fake.put("services", api_service("db", "10.96.0.11"))
    fake.delete("services", "default", "web")
    with client.watch(SERVICES, {"resourceVersion": str(since)}, seconds=1) as events:
        seen = [(event["type"], event["object"]["metadata"]["name"]) for event in events]
    assert seen == [("ADDED", "db"), ("DELETED", "web")]
    assert fake.requests[-1] == f"watch services@{since}"


def test_a_watch_from_a_version_too_old_is_expired(
        fake: FakeApiServer, client: ApiServerClient) -> None:
    fake.forget()
    with pytest.raises(Expired, match=rf"^GET {SERVICES} on {fake.url}: 410 too old$"):
        with client.watch(SERVICES, {"resourceVersion": "1"}, seconds=1):
            pass


def test_an_error_answer_names_the_request_and_the_servers_message(
        fake: FakeApiServer, client: ApiServerClient) -> None:
    fake.down()
    with pytest.raises(ApiServerError) as caught:
        client.get(SERVICES, {})
    assert str(caught.value) == f"GET {SERVICES} on {fake.url}: 503 unavailable"
    assert not isinstance(caught.value, Expired)
    fake.up()
    assert client.get(SERVICES, {})["items"]  # the pool serves the next request


class _Answer(BaseHTTPRequestHandler):
    """Answers every GET with the server's `answer` (status, body) and keeps
    the Authorization headers it got."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server: Any = self.server
        server.authorizations.append(self.headers.get("Authorization"))
        status, body = server.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def answering() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.authorizations = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


def _get(url: str, **access: Any) -> dict:
    client = ApiServerClient(ApiServerAccess(url, **access))
    try:
        return client.get("/api/v1/nodes", {})
    finally:
        client.close()


def test_a_refusal_says_what_access_kpng_py_needs(answering: Any) -> None:
    answering.answer = (403, b'{"kind": "Status", "message": "nodes is forbidden"}')
    with pytest.raises(ApiServerError, match=r"^GET /api/v1/nodes on http://127\.0\.0\.1:\d+: "
                                             r"403 nodes is forbidden; kpng-py needs to list "
                                             r"and watch services, nodes and endpointslices"):
        _get(answering.url)


@pytest.mark.parametrize("body, problem", [
    (b"<html>oops</html>", "the answer is not JSON"),
    (b"[1, 2]", "the answer is not a JSON object"),
])
def test_an_answer_that_is_no_json_object_is_an_error(answering: Any, body: bytes,
                                                       problem: str) -> None:
    answering.answer = (200, body)
    with pytest.raises(ApiServerError, match=rf"^GET /api/v1/nodes: {problem}"):
        _get(answering.url)


def test_the_token_file_is_read_at_each_request(answering: Any, tmp_path: Path) -> None:
    answering.answer = (200, b"{}")
    token = tmp_path / "token"
    token.write_text("first\n")
    client = ApiServerClient(ApiServerAccess(answering.url, token_file=token))
    try:
        client.get("/api/v1/nodes", {})
        token.write_text("rotated\n")
        client.get("/api/v1/nodes", {})
        token.unlink()
        with pytest.raises(ApiServerError, match=f"^token file {token}: No such file"):
            client.get("/api/v1/nodes", {})
    finally:
        client.close()
    assert answering.authorizations == ["Bearer first", "Bearer rotated"]


def test_a_server_that_is_not_there_is_an_error_naming_the_request() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}"
    with pytest.raises(ApiServerError, match=rf"^GET /api/v1/nodes on {url}: "):
        _get(url)
