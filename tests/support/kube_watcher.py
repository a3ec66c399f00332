"""A KubeWatcher following the fake API server (tests/support/fake_apiserver.py),
and the server's objects as kubectl lists them: the kube brain's tests."""

from __future__ import annotations

import threading

import yaml

from kpng_py.api import localv1
from kpng_py.brain.kube.access import ApiServerAccess
from kpng_py.brain.kube.client import ApiServerClient
from kpng_py.brain.kube.reflector import Timing
from kpng_py.brain.kube.watcher import ApiServerReport, KubeWatcher
from kpng_py.brain.settings import Coalesce
from kpng_py.brain.source import StateSnapshots
from kpng_py.brain.view import NodeView
from kpng_py.healthcheck.proxier_health import SyncHealth
from kpng_py.metrics.metrics import Metrics
from tests.support.fake_apiserver import FakeApiServer

# Small pages (lists take several), watches the server ends after a second,
# short delays.
FAST = Timing(page=2, watch_seconds=(1, 1), error_delay=0.05, max_error_delay=0.2)


class Following:
    """A KubeWatcher following the fake server, its metrics and health."""

    def __init__(self, fake: FakeApiServer, coalesce: Coalesce = Coalesce(0.05, 0.5)) -> None:
        self.metrics = Metrics()
        self.health = SyncHealth(timeout=0.2)
        report = ApiServerReport(self.metrics)
        report.attach(self.health, serving=True)
        self.watcher = KubeWatcher(ApiServerClient(ApiServerAccess(fake.url)), self.metrics,
                                   report, coalesce, FAST)
        self.watcher.start()
        snapshots = self.watcher.wait_synced(threading.Event())
        assert snapshots is not None
        self.snapshots: StateSnapshots = snapshots

    def view(self, node: str = "node-a") -> NodeView:
        return self.snapshots.current_view(node)[1]

    def endpoints(self, service: str, node: str = "node-a") -> list[str]:
        """The IPs of the service's endpoints in the node's view."""
        return sorted(ip for (kind, path), value in self.view(node).items()
                      if kind == localv1.EndpointsSet and path.startswith(service + "/")
                      for ip in localv1.Endpoint.FromString(value).IPs.V4)

    def skipped(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value(
            "kpng_py_skipped_total", {"reason": reason}) or 0

    def connected(self) -> float | None:
        return self.metrics.registry.get_sample_value("kpng_py_api_server_connected")


def kubectl_list(fake: FakeApiServer) -> str:
    """The fake server's objects as `kubectl get -o yaml` lists them."""
    kinds = {"services": "Service", "endpointslices": "EndpointSlice", "nodes": "Node"}
    items = [{"kind": kinds[resource], **obj} for resource, objects in fake.objects.items()
             for obj in objects.values()]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
