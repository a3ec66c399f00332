"""Builders for state files and a watch client that records what it applied."""

from __future__ import annotations

import io
import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from kpng_py.api import localv1
from kpng_py.brain.source import BrainSource
from kpng_py.brain.watcher import StateFileWatcher
from kpng_py.dataplane.applier import ChangeSetApplier
from kpng_py.dataplane.print_backend import PrintBackend
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.serve.server import LocalApiServer
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from kpng_py.transport import ListenAddress
from kpng_py.watch.client import ClientConfig, WatchClient
from tests.support.process import WAIT_SECONDS, wait_until
from tests.support.watch import WholeChangeSets

TCP, UDP, SCTP = localv1.TCP, localv1.UDP, localv1.SCTP


# -- state files ----------------------------------------------------------------

def port(name: str = "", protocol: int = TCP, number: int = 80, **fields: Any) -> dict:
    return {"name": name, "protocol": protocol, "port": number, **fields}


def endpoint(*ips: str, node: str = "", pod: str | None = None,
             overrides: dict[str, int] | None = None, **fields: Any) -> dict:
    info: dict[str, Any] = {
        "endpoint": {
            "ips": _ipset(ips),
            "portoverrides": [{"name": n, "port": p} for n, p in (overrides or {}).items()],
        },
        "topology": {"node": node},
        **fields,
    }
    if pod is not None:
        info["podname"] = pod
    return info


def service(name: str, cluster_ips: tuple[str, ...], ports: list[dict],
            endpoints: list[dict] | None = None, **fields: Any) -> dict:
    return {
        "service": {"name": name, "type": "ClusterIP",
                    "ips": {"clusterips": _ipset(cluster_ips)}, "ports": ports, **fields},
        "endpoints": endpoints or [],
    }


def state(*services: dict, nodes: list[dict] | None = None) -> dict:
    return {"nodes": nodes or [], "services": list(services)}


def flow_entry(value: dict) -> str:
    """A mapping in YAML's flow style, on one line."""
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()


def flow_sequences(document: dict) -> str:
    """A state file whose top-level keys hold flow sequences, one entry a
    line (`services: [{...},` then `  {...}]`), as written by hand: flow
    style throughout, yaml.dump makes the document one flow mapping."""
    return "".join(f"{key}: [" + ",\n  ".join(map(flow_entry, values)) + "]\n"
                   for key, values in document.items())


def _ipset(ips: tuple[str, ...]) -> dict:
    return {"v4": [ip for ip in ips if ":" not in ip], "v6": [ip for ip in ips if ":" in ip]}


# A small cluster several tests start from: two nodes in two zones; `web` is
# dual-stack with one named port whose target differs per endpoint; `dns` has
# internalTrafficPolicy Local.
NODES = [{"name": "n1", "topology": {"node": "n1", "zone": "z1"}},
         {"name": "n2", "topology": {"node": "n2", "zone": "z2"}}]
W1 = endpoint("10.1.1.1", "fd00:1::1", node="n1", pod="w1", overrides={"http": 8080})
W2 = endpoint("10.1.2.1", node="n2", pod="w2", overrides={"http": 8081})
DNS = service("dns", ("10.96.0.53",), [port("dns", UDP, 53, targetport=5353)], [
    endpoint("10.1.1.2", node="n1", pod="d1"), endpoint("10.1.2.2", node="n2", pod="d2")],
    internaltraffictolocal=True)


def web(*endpoints: dict) -> dict:
    return service("web", ("10.96.0.10", "fd00:96::10"), [port("http", targetportname="http")],
                   list(endpoints))


class StateFile:
    """The state file a test edits, the way editors save: replaced by default,
    or rewritten in place."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, document: dict | str, in_place: bool = False) -> None:
        text = document if isinstance(document, str) else yaml.safe_dump(document)
        if in_place:
            with self.path.open("w", encoding="utf-8") as out:
                out.write(text)
            return
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, self.path)

    def date_back(self, seconds: float = 60.0) -> None:
        """Date the mtime back, as if the file had been saved `seconds` ago."""
        then = time.time() - seconds
        os.utime(self.path, (then, then))


# -- watching -----------------------------------------------------------------

def op_kinds(ops: Iterable[localv1.OpItem]) -> list[str]:
    """`Reset`, `Sync`, `Set services/ns/name`, `Delete endpoints/ns/svc/key`..."""
    names = {localv1.ServicesSet: "services", localv1.EndpointsSet: "endpoints"}
    kinds = []
    for op in ops:
        kind = op.WhichOneof("Op")
        ref = op.Set.Ref if kind == "Set" else op.Delete if kind == "Delete" else None
        kinds.append(f"{kind} {names[ref.Set]}/{ref.Path}" if ref is not None else kind)
    return kinds


@dataclass(frozen=True)
class Applied:
    """One change set as a client received and applied it."""

    ops: list[localv1.OpItem]
    changes: ServicePortChanges
    printed: dict  # the to-print line after it

    def op_kinds(self) -> list[str]:
        return op_kinds(self.ops)

    def endpoints(self) -> dict[str, list[str]]:
        """`name/protocol` -> the endpoints to-print shows for it."""
        return {f"{p['name']}/{p['protocol']}": p["endpoints"]
                for p in self.printed["servicePorts"]}


class RecordingSink:
    """Applies change sets as `kpng-py local ... to-print` does and keeps each."""

    def __init__(self) -> None:
        self._out = io.StringIO()
        self._metrics = Metrics()
        self._applier = ChangeSetApplier(PrintBackend(self._out), NodeState(Skips(self._metrics)),
                                          self._metrics)
        self.applied: queue.Queue[Applied] = queue.Queue()
        self.stream_errors: queue.Queue[str] = queue.Queue()

    def on_changeset_started(self) -> None:
        pass

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        changes = self._applier.apply_ops(ops)
        assert changes is not None
        printed = json.loads(self._out.getvalue().splitlines()[-1])
        self.applied.put(Applied(list(ops), changes, printed))

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        self.stream_errors.put(reason)


class Client:
    """A WatchClient on its own thread."""

    def __init__(self, socket: Path, node_name: str) -> None:
        self.sink = RecordingSink()
        config = ClientConfig(target=f"unix://{socket}", node_name=node_name,
                              error_delay=0.05, max_error_delay=0.2)
        self._client = WatchClient(config, WholeChangeSets(self.sink), Metrics())
        self._thread = threading.Thread(target=self._client.run, daemon=True)
        self._thread.start()

    def next(self) -> Applied:
        return self.sink.applied.get(timeout=WAIT_SECONDS)

    def pending(self) -> int:
        return self.sink.applied.qsize()

    def stop(self) -> None:
        self._client.stop()
        self._thread.join(WAIT_SECONDS)
        assert not self._thread.is_alive(), "the watch client did not stop"


class Brain:
    """The built-in brain on a unix socket, as `kpng-py file ... to-api` runs it,
    watching its file with a short poll interval."""

    def __init__(self, state_file: StateFile, socket: Path) -> None:
        self.state_file = state_file
        self.socket = socket
        self.watcher = StateFileWatcher(state_file.path, poll_seconds=0.05)
        self.watcher.start()
        self.server: LocalApiServer | None = None
        self.clients: list[Client] = []
        self.start_server()

    def start_server(self) -> None:
        self.server = LocalApiServer(BrainSource(self.watcher.snapshots),
                                     ListenAddress(unix_path=self.socket))
        self.server.start()

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0)
            self.server = None

    def client(self, node_name: str) -> Client:
        client = Client(self.socket, node_name)
        self.clients.append(client)
        return client

    def wait_version(self, version: int) -> None:
        """Wait until the watcher has published `version` of the state."""
        wait_until(lambda: self.watcher.snapshots.version >= version,
                   f"state version {version}")

    def close(self) -> None:
        for client in self.clients:
            client.stop()
        self.stop_server()
        self.watcher.stop()
