"""When a starting brain serves, and when its changes arrive: a client,
kpng-py's own watch client, that waits for the brain's socket and stops at
its first Sync (or its `--syncs`th; 0: when stopped).

    python -m bench.brain_probe --socket PATH --node-name NODE --timeout S [--syncs N]

prints one JSON line at the first Sync: `first_message` and `first_sync`,
the time.monotonic() at which the stream's first message and its first Sync
arrived (the host's CLOCK_MONOTONIC: the bench compares them with the
brain's start), and `ops`, the change set's size; then one line per later
Sync, `{"sync": time.monotonic()}`. Exits 1 (with the reason on stderr) if
the brain did not serve within the timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Sequence, TextIO

from kpng_py.api import localv1
from kpng_py.metrics.metrics import Metrics
from kpng_py.watch.client import ClientConfig, WatchClient

# A socket that exists may not accept yet: retry soon, not after the client's 1 s.
RETRY_SECONDS = 0.02


class Syncs:
    """An OpsSink that notes when the first change set began and ended, and
    writes a line to `out` at each Sync; it stops the client at the
    `wanted`th (0: never)."""

    def __init__(self, out: TextIO, wanted: int = 1) -> None:
        self.first_message: float | None = None
        self.first_sync: float | None = None
        self.ops = 0
        self.client: WatchClient | None = None
        self._out = out
        self._wanted = wanted
        self._syncs = 0

    def on_changeset_started(self) -> None:
        if self.first_message is None:
            self.first_message = time.monotonic()

    def on_ops(self, ops: list[localv1.OpItem]) -> None:
        if self.first_sync is None:
            self.ops += len(ops)

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        now = time.monotonic()
        self._syncs += 1
        if self.first_sync is None:
            self.first_sync = now
            self.ops += len(ops)
            line = {"first_message": self.first_message, "first_sync": now, "ops": self.ops}
        else:
            line = {"sync": now}
        print(json.dumps(line), file=self._out, flush=True)
        if self._syncs == self._wanted and self.client is not None:
            self.client.stop()

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        del reason, partial  # the client retries; a partial change set is not a Sync
        if self.first_sync is None:
            self.first_message = None
            self.ops = 0


def probe(socket: Path, node_name: str, timeout: float, sink: Syncs) -> None:
    deadline = time.monotonic() + timeout
    while not socket.is_socket():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no socket at {socket} after {timeout} s")
        time.sleep(0.005)
    config = ClientConfig(target=f"unix://{socket}", node_name=node_name,
                          error_delay=RETRY_SECONDS, max_error_delay=RETRY_SECONDS)
    client = WatchClient(config, sink, Metrics())
    sink.client = client
    stopper = threading.Timer(max(0.0, deadline - time.monotonic()), client.stop)
    stopper.start()
    try:
        client.run()
    finally:
        stopper.cancel()
    if sink.first_sync is None:
        raise TimeoutError(f"no Sync from {socket} within {timeout} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.brain_probe")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds for the first Sync (and the run, with --syncs)")
    parser.add_argument("--syncs", type=int, default=1, help="Syncs to stop at (0: none)")
    args = parser.parse_args(argv)
    try:
        probe(args.socket, args.node_name, args.timeout, Syncs(sys.stdout, args.syncs))
    except TimeoutError as err:
        print(f"brain_probe: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
