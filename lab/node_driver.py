"""The userspace backend inside the node namespace (proxy_node.py), fed
ServicePortChanges by a test.

Reads pickled requests (a 4-byte big-endian length, then the pickle) on
stdin: a ServicePortChanges is applied and answered with "applied" (or the error),
the string "counts" with the process's counters as one JSON line
({"name:label,...": value}). Closes the backend at EOF. Says "ready" once
set up, or "setup-error: MESSAGE" (and exits 2) when the backend refuses to
set up. Flags are the backend's own (`to-userspace --help`); logs are JSON
lines on stderr.

    python -m lab.node_driver [--udp-idle-timeout 1 ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import struct
import sys

from backends.userspace import cli
from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.healthcheck.proxier_health import SyncHealth
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.logs import setup_logging


def _counts(metrics: Metrics) -> dict[str, float]:
    return {f"{sample.name}:{','.join(sample.labels.values())}": sample.value
            for family in metrics.registry.collect() if family.type == "counter"
            for sample in family.samples if sample.name.endswith("_total")}


def main() -> None:
    parser = argparse.ArgumentParser()
    cli.BACKEND.add_arguments(parser)
    setup_logging("json", verbosity=0)
    metrics = Metrics()
    backend = cli.create(parser.parse_args(), metrics)  # the UserspaceBackend, unwrapped
    # What /healthz would say (healthCheckNodePort answers carry it): current
    # after each applied change set, as the applier reports it.
    health = SyncHealth(timeout=3600)
    backend.use_health(health)
    try:
        backend.setup()
    except BackendSetupError as err:
        backend.close()
        print(f"setup-error: {err}", flush=True)
        sys.exit(2)
    stdin = sys.stdin.buffer
    print("ready", flush=True)
    try:
        while header := stdin.read(4):
            request = pickle.loads(stdin.read(struct.unpack(">I", header)[0]))
            if request == "counts":
                print(json.dumps(_counts(metrics)), flush=True)
                continue
            try:
                backend.apply(request)
            except Exception as err:  # reported to the test, which fails on it
                logging.exception("apply failed")
                print(f"error: {err!r}", flush=True)
            else:
                health.changeset_applied()
                print("applied", flush=True)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
