"""The watch stream's transport alone: CPU and wall seconds a watch client
takes to receive the first Sync of N services x E endpoints (one op per
message: 1 + N + N*E + 1 messages), from a server in a process of its own:

* `grpcio`: the tests' reference server, lab/localv1_servers.py (grpcio's
  asyncio server, one HTTP/2 DATA frame per message, as gRPC servers send them);
* `h2`: lab/localv1_servers.py's H2Brain, which writes the whole answer at once,
  prepared bytes packed into full DATA frames as flow control allows, so the
  client is the limit.

    .venv/bin/python -m bench.transport [--services 10000] [--endpoints 10]
        [--runs 3] [--server grpcio --server h2]
        [--client kpng_py/watch/client.py] [--client OTHER/client.py ...]

Each `--client` is a file defining `WatchClient` and `ClientConfig` (e.g. an
older kpng_py/watch/client.py, from `git show`); the clients take turns, run by
run, in one invocation, so they are compared side by side on one machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from kpng_py.api import localv1
from kpng_py.metrics.metrics import Metrics
from kpng_py.serve.server import Reply, wait_until_cancelled
from lab.localv1_servers import GrpcioBrain, H2Brain, framed


def _full_state(services: int, endpoints: int) -> Iterator[localv1.OpItem]:
    """Reset, the services, their endpoints (each its own op), Sync."""
    def value(kind: int, path: str, message) -> localv1.OpItem:
        return localv1.OpItem(Set=localv1.Value(Ref=localv1.Ref(Set=kind, Path=path),
                                                Bytes=message.SerializeToString()))

    def ip(base: int, n: int) -> str:
        return f"10.{base + n // 62500}.{n // 250 % 250}.{n % 250 + 1}"

    yield localv1.OpItem(Reset=localv1.EmptyOp())
    for i in range(services):
        yield value(localv1.ServicesSet, f"default/svc-{i}", localv1.Service(
            Namespace="default", Name=f"svc-{i}", Type="ClusterIP",
            IPs=localv1.ServiceIPs(ClusterIPs=localv1.IPSet(V4=[ip(96, i)])),
            Ports=[localv1.PortMapping(Name="http", Protocol=localv1.TCP, Port=80,
                                       TargetPort=8080)]))
    for n in range(services * endpoints):
        yield value(localv1.EndpointsSet, f"default/svc-{n // endpoints}/pod-{n}",
                    localv1.Endpoint(IPs=localv1.IPSet(V4=[ip(128, n)]),
                                     PortOverrides=[localv1.PortName(Name="http", Port=8080)]))
    yield localv1.OpItem(Sync=localv1.EmptyOp())


class _FullState:
    """A ChangeSetSource: each stream's first WatchReq gets `ops`, then quiet."""

    def __init__(self, ops: tuple[localv1.OpItem, ...]) -> None:
        self._ops = ops

    def open_stream(self) -> _FullState.Session:
        return _FullState.Session(self._ops)

    class Session:
        def __init__(self, ops: tuple[localv1.OpItem, ...]) -> None:
            self._ops: tuple[localv1.OpItem, ...] | None = ops

        async def next_reply(self, node_name: str) -> Reply:
            ops, self._ops = self._ops, None
            if ops is None:
                await wait_until_cancelled()
            return Reply(ops)

        def close(self) -> None:
            pass


def _serve(kind: str, socket: Path, services: int, endpoints: int) -> None:
    """The server process: answers each stream's first WatchReq with the
    full state, then stays quiet."""
    ops = tuple(_full_state(services, endpoints))
    if kind == "h2":
        H2Brain(framed(*ops)).start(socket)
    else:
        GrpcioBrain(_FullState(ops), f"unix:{socket}").start()
    while not socket.exists():
        time.sleep(0.01)
    print(len(ops), flush=True)
    sys.stdin.read()  # until the driver closes it


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"client_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def _receive(client_file: Path, target: str) -> None:
    """The client process: one full sync received; prints its figures."""
    module = _load(client_file)
    started_wall, started_cpu = time.monotonic(), time.process_time()
    figures: dict[str, float] = {}

    class Sink:
        client: Any = None  # the loaded module's WatchClient, once made
        staged = 0  # ops handed over before the Sync (clients since issue 14)

        def on_changeset_started(self) -> None:
            pass

        def on_ops(self, ops) -> None:
            self.staged += len(ops)

        def on_changeset(self, ops) -> None:
            figures.update(wall_s=time.monotonic() - started_wall,
                           cpu_s=time.process_time() - started_cpu, ops=self.staged + len(ops))
            self.client.stop()

        def on_stream_error(self, reason, partial) -> None:
            figures["error"] = reason

    sink = Sink()
    sink.client = module.WatchClient(module.ClientConfig(target, "node-a"), sink, Metrics())
    sink.client.run()
    print(json.dumps(figures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--client", type=Path, action="append")
    parser.add_argument("--server", choices=("grpcio", "h2"), action="append")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--receive", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return _serve(args.serve[0], Path(args.serve[1]), args.services, args.endpoints)
    if args.receive:
        return _receive(Path(args.receive[0]), args.receive[1])
    for kind in args.server or ["grpcio", "h2"]:
        _compare(kind, args.client or [Path("kpng_py/watch/client.py")], args)


def _compare(kind: str, clients: list[Path], args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="kpng-transport-") as directory:
        socket = Path(directory) / "b.sock"
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.transport", "--services", str(args.services),
             "--endpoints", str(args.endpoints), "--serve", kind, str(socket)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert server.stdin is not None and server.stdout is not None  # piped
        try:
            messages = int(server.stdout.readline())
            print(f"server {kind}: {messages} messages", flush=True)
            for run in range(args.runs):
                for client in clients:
                    out = subprocess.run(
                        [sys.executable, "-m", "bench.transport", "--receive", str(client),
                         f"unix://{socket}"], check=True, capture_output=True, text=True,
                        timeout=600).stdout
                    print(f"  run {run + 1} {client}: {out.strip()}", flush=True)
        finally:
            server.stdin.close()
            server.wait(30)

if __name__ == "__main__":
    main()
