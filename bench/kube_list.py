"""Which Kubernetes client library lists fastest and smallest: a real API
server (the lab's, lab/kube_control_plane.py) holding N Services and N
EndpointSlices of E endpoints each, listed in pages of 500 (as client-go's
reflector lists) by each contender in a process of its own; its wall time
and peak RSS (docs/bench.md, "Listing the Kubernetes API").

    flock /work/notes/heavy.lock .venv/bin/python bench/kube_list.py \\
        --python /tmp/kube-bench-venv/bin/python

Each contender ends holding every item (as a brain's store does) as plain
Python values (what kpng-py's brain maps), or as its own typed models where
that is all it offers (lightkube) or its default (kubernetes-models). The
last, kpng-py-kube, is kpng-py's brain itself with the one chosen, from its
start to its first state (the stores keep only what the mapping reads). The
contenders' libraries are not kpng-py's dependencies (but the one chosen):
`--python` names an interpreter that has them, made with

    python3 -m venv /tmp/kube-bench-venv && /tmp/kube-bench-venv/bin/pip install \\
        kubernetes==37.0.2 kubernetes-asyncio==36.1.0 lightkube==1.0.1 \\
        lightkube-models==1.37.0.8 httpx==0.28.1 urllib3==2.8.0

Needs root (the control plane runs in a cgroup of the run) and the
components hack/setup.sh builds. Creating the objects takes about a minute
at 10 000 (concurrent POSTs over kept-alive connections on loopback).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import shutil
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
PAGE = 500
SERVICES = "/api/v1/services"
SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
CONTENDERS = ("urllib3", "httpx", "kubernetes", "kubernetes-models", "kubernetes_asyncio",
              "lightkube", "kpng-py-kube")
# Run by kpng-py's own interpreter (the others by --python's).
_OWN = ("kpng-py-kube",)
_POSTERS = 16


# -- the objects -----------------------------------------------------------------


def service(index: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"svc-{index}", "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def endpoint_slice(index: int, endpoints: int) -> dict:
    """A slice as the EndpointSlice controller writes one (made by hand: a
    Service without a selector has none of the controller's)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{index}-abcde", "namespace": "default", "labels": {
                "kubernetes.io/service-name": f"svc-{index}",
                "endpointslice.kubernetes.io/managed-by": "bench.kpng-py"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [f"10.{244 + (index * endpoints + e) // 65536 % 8}."
                                         f"{(index * endpoints + e) // 256 % 256}."
                                         f"{(index * endpoints + e) % 256}"],
                           "conditions": {"ready": True, "serving": True, "terminating": False},
                           "nodeName": f"node-{e % 3}", "zone": "zone-a",
                           "targetRef": {"kind": "Pod", "namespace": "default",
                                         "name": f"svc-{index}-pod-{e}"}}
                          for e in range(endpoints)]}


class Poster:
    """Requests over one kept-alive HTTPS connection (one per thread)."""

    def __init__(self, url: str, token: str, ca: str) -> None:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"{url!r} names no host: give the API server's https://host:port")
        host = parts.hostname
        self._connect = lambda: http.client.HTTPSConnection(
            host, parts.port, context=ssl.create_default_context(cafile=ca))
        self._token = token
        self._local = threading.local()

    def post(self, path: str, obj: dict) -> None:
        """Create `obj`; one that exists already is left as it is."""
        self.send("POST", path, obj, "application/json", ok=(201, 409))

    def send(self, method: str, path: str, obj: dict, content_type: str,
             ok: tuple[int, ...] = (200,)) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self._connect()
        connection.request(method, path, json.dumps(obj), {
            "Authorization": f"Bearer {self._token}", "Content-Type": content_type})
        answer = connection.getresponse()
        body = answer.read()
        if answer.status not in ok:
            raise RuntimeError(f"{method} {path}: {answer.status} {body[:300]!r}")


def create_objects(poster: Poster, count: int, endpoints: int) -> float:
    started = time.monotonic()
    jobs: list[tuple[str, dict]] = []
    for index in range(count):
        jobs.append(("/api/v1/namespaces/default/services", service(index)))
        jobs.append(("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                     endpoint_slice(index, endpoints)))
    with ThreadPoolExecutor(_POSTERS) as pool:
        list(pool.map(lambda job: poster.post(*job), jobs))
    return time.monotonic() - started


# -- the contenders, each in a process of its own ------------------------------


def _paged(get_page: Callable[[str, str], dict], path: str) -> Iterator[dict]:
    """Every item of a list, PAGE at a time (`continue` tokens)."""
    token = ""
    while True:
        page = get_page(path, token)
        yield from page["items"]
        token = page["metadata"].get("continue") or ""
        if not token:
            return


def _query(token: str) -> str:
    return f"?limit={PAGE}" + (f"&continue={token}" if token else "")


def list_urllib3(url: str, token: str, ca: str) -> list[list]:
    import urllib3

    pool = urllib3.PoolManager(ca_certs=ca, headers={"Authorization": f"Bearer {token}"})

    def get_page(path: str, cont: str) -> dict:
        answer = pool.request("GET", url + path + _query(cont), preload_content=False)
        try:
            return json.load(answer)
        finally:
            answer.release_conn()

    return [list(_paged(get_page, path)) for path in (SERVICES, SLICES)]


def list_httpx(url: str, token: str, ca: str) -> list[list]:
    import httpx

    with httpx.Client(verify=ssl.create_default_context(cafile=ca),
                      headers={"Authorization": f"Bearer {token}"}) as client:
        def get_page(path: str, cont: str) -> dict:
            return json.loads(client.get(url + path + _query(cont)).content)

        return [list(_paged(get_page, path)) for path in (SERVICES, SLICES)]


def _kubernetes_client(url: str, token: str, ca: str) -> Any:
    import kubernetes

    config = kubernetes.client.Configuration()
    config.host, config.ssl_ca_cert = url, ca
    config.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(config)


def list_kubernetes(url: str, token: str, ca: str) -> list[list]:
    import kubernetes

    client = _kubernetes_client(url, token, ca)
    core, discovery = kubernetes.client.CoreV1Api(client), kubernetes.client.DiscoveryV1Api(client)
    calls = {SERVICES: core.list_service_for_all_namespaces,
             SLICES: discovery.list_endpoint_slice_for_all_namespaces}

    def get_page(path: str, cont: str) -> dict:
        answer = calls[path](limit=PAGE, _continue=cont or None, _preload_content=False)
        return json.loads(answer.data)

    return [list(_paged(get_page, path)) for path in (SERVICES, SLICES)]


def list_kubernetes_models(url: str, token: str, ca: str) -> list[list]:
    """The library's default: every item deserialized into its model."""
    import kubernetes

    client = _kubernetes_client(url, token, ca)
    core, discovery = kubernetes.client.CoreV1Api(client), kubernetes.client.DiscoveryV1Api(client)
    lists = []
    for call in (core.list_service_for_all_namespaces,
                 discovery.list_endpoint_slice_for_all_namespaces):
        items, cont = [], None
        while True:
            page = call(limit=PAGE, _continue=cont)
            items += page.items
            cont = page.metadata._continue
            if not cont:
                break
        lists.append(items)
    return lists


def list_kubernetes_asyncio(url: str, token: str, ca: str) -> list[list]:
    async def run() -> list[list]:
        import kubernetes_asyncio

        config = kubernetes_asyncio.client.Configuration()
        config.host, config.ssl_ca_cert = url, ca
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        async with kubernetes_asyncio.client.ApiClient(config) as client:
            core = kubernetes_asyncio.client.CoreV1Api(client)
            discovery = kubernetes_asyncio.client.DiscoveryV1Api(client)
            lists = []
            for call in (core.list_service_for_all_namespaces,
                         discovery.list_endpoint_slice_for_all_namespaces):
                items, cont = [], None
                while True:
                    answer = await call(limit=PAGE, _continue=cont, _preload_content=False)
                    page = json.loads(await answer.read())
                    items += page["items"]
                    cont = page["metadata"].get("continue")
                    if not cont:
                        break
                lists.append(items)
            return lists

    return asyncio.run(run())


def list_lightkube(url: str, token: str, ca: str) -> list[list]:
    from lightkube import ALL_NS, Client, KubeConfig
    from lightkube.resources.core_v1 import Service
    from lightkube.resources.discovery_v1 import EndpointSlice

    config = KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "admin"}}]})
    client = Client(config)
    return [list(client.list(kind, namespace=ALL_NS, chunk_size=PAGE))
            for kind in (Service, EndpointSlice)]


def list_kpng_py_kube(url: str, token: str, ca: str) -> list[list]:
    """kpng-py's own brain (urllib3, the stores, the first state made):
    from its start to its first state. Its items: the services and
    endpoints of a node's view."""
    from kpng_py.api import localv1
    from kpng_py.brain.kube.access import ApiServerAccess
    from kpng_py.brain.kube.client import ApiServerClient
    from kpng_py.brain.kube.watcher import ApiServerReport, KubeWatcher
    from kpng_py.metrics.metrics import Metrics

    metrics = Metrics()
    access = ApiServerAccess(url, ca_pem=Path(ca).read_text(), token=token)
    watcher = KubeWatcher(ApiServerClient(access), metrics, ApiServerReport(metrics))
    watcher.start()
    snapshots = watcher.wait_synced(threading.Event())
    assert snapshots is not None
    view = snapshots.current_view("node-0")[1]
    watcher.stop()
    return [[ref for ref in view if ref[0] == kind]
            for kind in (localv1.ServicesSet, localv1.EndpointsSet)]


LISTS: dict[str, Callable[[str, str, str], list[list]]] = {
    "urllib3": list_urllib3, "httpx": list_httpx, "kubernetes": list_kubernetes,
    "kubernetes-models": list_kubernetes_models, "kubernetes_asyncio": list_kubernetes_asyncio,
    "lightkube": list_lightkube, "kpng-py-kube": list_kpng_py_kube}


def child(contender: str, url: str, token: str, ca: str) -> None:
    """Run in a process of its own: import, list, report (one JSON line)."""
    started = time.monotonic()
    lists = LISTS[contender](url, token, ca)
    seconds = time.monotonic() - started
    print(json.dumps({"contender": contender, "seconds": round(seconds, 2),
                      "peak_rss_mib": round(_peak_rss_kib() / 1024, 1),
                      "items": [len(items) for items in lists]}))


def _peak_rss_kib() -> int:
    """This process's peak RSS (VmHWM: of its own memory since its exec;
    getrusage's ru_maxrss would count the parent's, the forked copy's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


# -- the run ---------------------------------------------------------------------


def measure(python: str, contender: str, url: str, token: str, ca: str) -> dict:
    python = sys.executable if contender in _OWN else python
    done = subprocess.run([python, str(Path(__file__).resolve()), "child", contender, url,
                           token, ca], capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{contender} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> None:
    from lab.kube_control_plane import KubeControlPlane
    from lab.names import RunNames

    names = RunNames.for_this_process()
    workdir = names.make_workdir()
    control = KubeControlPlane(names, workdir, ["10.96.0.0/16"])
    try:
        api = control.start()
        access = api.access
        seconds = create_objects(Poster(access.url, access.token, str(access.ca)),
                                 args.count, args.endpoints)
        print(f"created {args.count} services and {args.count} slices of {args.endpoints} "
              f"endpoints in {seconds:.1f} s", flush=True)
        for round_ in range(args.rounds):
            for contender in args.contenders.split(","):
                figures = measure(args.python, contender, access.url, access.token,
                                  str(access.ca))
                print(json.dumps({"round": round_ + 1, **figures}), flush=True)
    finally:
        control.stop()
        shutil.rmtree(workdir)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10000, help="services (and slices)")
    parser.add_argument("--endpoints", type=int, default=10, help="endpoints per slice")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter with the contenders' libraries")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    run(parser.parse_args())


if __name__ == "__main__":
    main()
