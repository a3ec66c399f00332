"""The userspace backend inside the node namespace, fed ChangeSets by a test.

Reads pickled ChangeSets (a 4-byte big-endian length, then the pickle) on
stdin, applies each and answers "applied" (or the error) on stdout; closes
the backend at EOF. Flags are the backend's own (`to-userspace --help`).

    python -m tests.userspace.node_driver [--udp-idle-timeout 1 ...]
"""

from __future__ import annotations

import argparse
import logging
import pickle
import struct
import sys

from backends.userspace import cli
from kpng_py.logs import setup_logging
from kpng_py.metrics import Metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    setup_logging("text", verbosity=0)
    backend = cli.create(parser.parse_args(), Metrics())
    backend.setup()
    stdin = sys.stdin.buffer
    print("ready", flush=True)
    try:
        while header := stdin.read(4):
            changes = pickle.loads(stdin.read(struct.unpack(">I", header)[0]))
            try:
                backend.apply(changes)
            except Exception as err:  # reported to the test, which fails on it
                logging.exception("apply failed")
                print(f"error: {err!r}", flush=True)
            else:
                print("applied", flush=True)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
