"""Record what a real API server sends `kpng-py kube`: the lists of Services,
EndpointSlices and Nodes, then the watch events from the lists'
resourceVersions while pods turn unready, terminate and go, and a Service is
deleted. The lab's control plane (lab/kube_control_plane.py: the real
EndpointSlice controller makes the slices); a heavy run:

    flock /work/notes/heavy.lock .venv/bin/python -m tests.support.record_kube_api

writes tests/brain/data/kube/: list-<resource>.json (the answers as sent)
and watch-<resource>.jsonl (one event a line, as sent).
"""

from __future__ import annotations

import json
import shutil
import ssl
import threading
import time
import urllib.request
from pathlib import Path

from lab.kube_control_plane import KubeApi, KubeControlPlane
from lab.names import RunNames
from lab.procs import wait_until

OUT = Path(__file__).resolve().parent.parent / "brain" / "data" / "kube"
SERVICE_CIDRS = ("10.96.0.0/16", "fd00:10:96::/112")
PATHS = {"services": "/api/v1/services",
         "endpointslices": "/apis/discovery.k8s.io/v1/endpointslices",
         "nodes": "/api/v1/nodes"}
PODS = {"web-0": ("node-a", ("10.244.0.5", "fd00:10:244::5")),
        "web-1": ("node-b", ("10.244.1.7", "fd00:10:244:1::7")),
        "db-0": ("node-a", ("10.244.0.9",))}
WATCH_SECONDS = 12


def _pod(name: str, node: str) -> dict:
    app = name.split("-")[0]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{
                "name": app, "image": "lab.invalid/app:1",
                "ports": [{"name": "http", "containerPort": 8080},
                          {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]}]}}


def _service(name: str, spec: dict, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, **({"labels": labels} if labels else {})}, "spec": spec}


def populate(api: KubeApi) -> None:
    """Two nodes in two zones, seven services (three that kube-proxy does
    not program: headless, ExternalName, another proxy's; and a load
    balancer with an ingress IP of each ipMode), three ready pods."""
    api.register_node("node-a", ["10.0.0.1", "fd00::1"], zone="zone-a")
    api.register_node("node-b", ["10.0.0.2", "fd00::2"], zone="zone-b")
    services = "/api/v1/namespaces/default/services"
    api.create(services, _service("web", {
        "selector": {"app": "web"}, "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                  {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}))
    api.create(services, _service("web-local", {
        "type": "NodePort", "selector": {"app": "web"}, "externalTrafficPolicy": "Local",
        "sessionAffinity": "ClientIP",
        "ports": [{"name": "https", "port": 443, "targetPort": 8080}]}))
    api.create(services, _service("db", {
        "clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]}))
    api.create(services, _service("gone", {
        "selector": {"app": "web"}, "ports": [{"port": 8081, "targetPort": 8080}]}))
    api.create(services, _service("docs", {"type": "ExternalName",
                                           "externalName": "docs.example.com"}))
    # The EndpointSlice controller copies the label onto the service's slices.
    api.create(services, _service("mesh", {
        "selector": {"app": "web"}, "ports": [{"port": 8082, "targetPort": 8080}]},
        labels={"service.kubernetes.io/service-proxy-name": "another-proxy"}))
    api.create(services, _service("lb", {
        "type": "LoadBalancer", "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}))
    api.merge_patch("/api/v1/namespaces/default/services/lb/status", {
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP"},
                                                {"ip": "192.0.2.11", "ipMode": "Proxy"}]}}})
    for name, (node, ips) in PODS.items():
        api.create("/api/v1/namespaces/default/pods", _pod(name, node))
        api.pod_status("default", name, ips, ready=True)
    wait_until("every pod's endpoints ready", lambda: _ready_addresses(api) == {
        ip for _, ips in PODS.values() for ip in ips}, 30.0)


def _ready_addresses(api: KubeApi) -> set[str]:
    slices = api.get(PATHS["endpointslices"])["items"]
    return {address for s in slices for e in s.get("endpoints") or ()
            if (e.get("conditions") or {}).get("ready") for address in e["addresses"]}


def change(api: KubeApi) -> None:
    """What the watches record: a pod unready, one terminating then gone, a
    service deleted."""
    api.pod_status("default", "web-1", PODS["web-1"][1], ready=False)
    time.sleep(1)
    api.delete("/api/v1/namespaces/default/pods/web-0")
    time.sleep(1)
    api.delete("/api/v1/namespaces/default/pods/web-0", grace_seconds=0)
    api.delete("/api/v1/namespaces/default/services/gone")
    time.sleep(2)


def _get(api: KubeApi, path: str) -> urllib.request.Request:
    return urllib.request.Request(api.access.url + path, headers={
        "Authorization": f"Bearer {api.access.token}", "Accept": "application/json"})


def record_watch(api: KubeApi, resource: str, version: str, lines: list[bytes]) -> None:
    query = (f"?watch=1&resourceVersion={version}&allowWatchBookmarks=true"
             f"&timeoutSeconds={WATCH_SECONDS}")
    context = ssl.create_default_context(cafile=str(api.access.ca))
    with urllib.request.urlopen(_get(api, PATHS[resource] + query), context=context,
                                timeout=WATCH_SECONDS + 10) as answer:
        lines.extend(line for line in answer if line.strip())


def record(api: KubeApi) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    context = ssl.create_default_context(cafile=str(api.access.ca))
    versions = {}
    for resource, path in PATHS.items():
        with urllib.request.urlopen(_get(api, path), context=context, timeout=30) as answer:
            body = answer.read()
        (OUT / f"list-{resource}.json").write_bytes(body)
        versions[resource] = json.loads(body)["metadata"]["resourceVersion"]
    events: dict[str, list[bytes]] = {resource: [] for resource in PATHS}
    watches = [threading.Thread(target=record_watch, args=(api, resource, versions[resource],
                                                           events[resource]))
               for resource in PATHS]
    for watch in watches:
        watch.start()
    change(api)
    for watch in watches:
        watch.join(WATCH_SECONDS + 15)
    for resource, lines in events.items():
        (OUT / f"watch-{resource}.jsonl").write_bytes(b"".join(lines))


def main() -> None:
    names = RunNames.for_this_process()
    workdir = names.make_workdir()
    control = KubeControlPlane(names, workdir, SERVICE_CIDRS)
    try:
        api = control.start()
        populate(api)
        record(api)
    finally:
        control.stop()
        shutil.rmtree(workdir)
    print(f"recorded into {OUT}")


if __name__ == "__main__":
    main()
