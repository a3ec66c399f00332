"""A real Kubernetes control plane for the lab: etcd, kube-apiserver and
kube-controller-manager (its EndpointSlice controllers only), the binaries
hack/setup.sh builds from the Go modules that lab/components/ pins.

Everything listens on the machine's loopback at free ports: the API server
serves HTTPS with a CA, serving certificate, service-account key pair and an
admin token made for the run (openssl) in its work directory, where etcd
keeps its data too. The three processes run in a cgroup of the run
(`kpe2e-<pid>-control`), so the sweep of a run that was killed outright kills
them with its other processes, and removes the work directory
(lab/teardown.py). A lab writes what a kubelet would (`KubeApi.register_node`,
`pod_status`): the real controller then makes the EndpointSlices. A lab
node's network namespace, which has no route to the machine's loopback,
reaches the API server through a relay (`relay_command`, socat: a unix socket
in the work directory between the two loopbacks).
"""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from lab.names import CGROUP2_ROOT, RunNames
from lab.procs import Proc, in_cgroup, spawn, wait_until

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ROOT / "build" / "components"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
# The controllers the lab needs: Services' EndpointSlices, and those mirrored
# from Endpoints objects made by hand.
CONTROLLERS = "endpointslice-controller,endpointslice-mirroring-controller"
READY_SECONDS = 60.0  # seconds on an idle machine; more while another build runs


class ControlPlaneError(Exception):
    """A component is missing, or did not become ready; the message says which."""


def missing_binaries() -> list[str]:
    """The components hack/setup.sh has not built (yet)."""
    return [name for name in BINARIES if not (COMPONENTS / name).is_file()]


def version_of(binary: str) -> str:
    """What a component says its version is (`kube-apiserver --version`)."""
    done = subprocess.run([str(COMPONENTS / binary), "--version"], capture_output=True,
                          text=True, timeout=30, check=True)
    return done.stdout.strip().splitlines()[0]


@dataclass(frozen=True)
class ApiAccess:
    """How a client reaches the API server: its URL, the CA that signed its
    certificate and a bearer token of group system:masters."""

    url: str
    ca: Path
    token: str

    def kubeconfig(self) -> str:
        """A kubeconfig with this access (for the brains and the controller manager)."""
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": self.url,
                                                     "certificate-authority": str(self.ca)}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "admin"}}],
        }, indent=1)


def node_object(name: str, addresses: Sequence[str], zone: str) -> dict:
    """A Node as a kubelet registers it: its addresses, hostname and
    topology labels."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
            "status": {"addresses": [{"type": "Hostname", "address": name}, *(
                {"type": "InternalIP", "address": address} for address in addresses)]}}


class KubeApi:
    """The few calls a lab makes: create, read, patch and delete objects."""

    def __init__(self, access: ApiAccess) -> None:
        self.access = access
        self._tls = ssl.create_default_context(cafile=str(access.ca))

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> dict:
        return json.loads(self._call(method, path, body, content_type) or b"{}")

    def ready(self) -> bool:
        """Whether /readyz answers 200 (its body is text)."""
        try:
            self._call("GET", "/readyz", None, "application/json")
        except (ControlPlaneError, OSError):
            return False
        return True

    def _call(self, method: str, path: str, body: Any, content_type: str) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.access.url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.access.token}",
                     "Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30, context=self._tls) as answer:
                return answer.read()
        except urllib.error.HTTPError as err:
            raise ControlPlaneError(f"{method} {path}: {err.code} "
                                    f"{err.read().decode(errors='replace')[:500]}") from None

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, obj)

    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def delete(self, path: str, grace_seconds: int | None = None) -> dict:
        """Delete an object; a pod with `grace_seconds` None is only marked
        terminating (no kubelet here ends it), with 0 it is gone at once."""
        body = None if grace_seconds is None else {
            "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace_seconds}
        return self.request("DELETE", path, body)

    def merge_patch(self, path: str, patch: dict) -> dict:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def replace(self, path: str, obj: dict) -> dict:
        """PUT: the object becomes `obj` (what it leaves out, defaults)."""
        return self.request("PUT", path, obj)

    def register_node(self, name: str, addresses: Sequence[str], zone: str) -> dict:
        return self.create("/api/v1/nodes", node_object(name, addresses, zone))

    def pod_status(self, namespace: str, name: str, ips: Sequence[str], ready: bool,
                   terminating: bool = False) -> dict:
        """What a kubelet writes of a running pod: its IPs, phase Running and
        the Ready condition (False while it is not ready, or terminating)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready_now = "True" if ready and not terminating else "False"
        conditions = [{"type": kind, "status": status, "lastTransitionTime": now}
                      for kind, status in (("PodScheduled", "True"), ("Initialized", "True"),
                                           ("ContainersReady", ready_now),
                                           ("Ready", ready_now))]
        return self.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {
            "status": {"phase": "Running", "podIP": ips[0] if ips else None,
                       "podIPs": [{"ip": ip} for ip in ips], "startTime": now,
                       "conditions": conditions}})

    def endpoint_slices(self, namespace: str, service: str) -> list[dict]:
        return self.get(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
                        f"?labelSelector=kubernetes.io/service-name={service}")["items"]


class KubeControlPlane:
    """etcd, kube-apiserver and kube-controller-manager of one run, on
    loopback; `start` it (it stops what it started if a step fails), `stop`
    it. `service_cidrs`: one per family (dual-stack with two)."""

    def __init__(self, names: RunNames, workdir: Path, service_cidrs: Sequence[str]) -> None:
        self._names = names
        self._work = workdir / "control-plane"
        self._service_cidrs = tuple(service_cidrs)
        self.cgroup = CGROUP2_ROOT / f"{names.tag}-control"
        self._procs: list[Proc] = []
        self.api: KubeApi | None = None
        self._relay_socket: Path | None = None

    def start(self) -> KubeApi:
        missing = missing_binaries()
        if missing:
            raise ControlPlaneError(f"{', '.join(missing)} not built under {COMPONENTS}: run "
                                    "hack/setup.sh (it builds them with Go from "
                                    "lab/components/)")
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> KubeApi:
        (self._work / "logs").mkdir(parents=True)
        self.cgroup.mkdir()
        etcd_client, etcd_peer, secure = _free_ports(3)
        access = ApiAccess(f"https://127.0.0.1:{secure}", self._work / "ca.crt", _pki(self._work))
        etcd = f"http://127.0.0.1:{etcd_client}"
        self._spawn("etcd", [
            "--name", "lab", "--data-dir", str(self._work / "etcd"),
            "--listen-client-urls", etcd, "--advertise-client-urls", etcd,
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"lab=http://127.0.0.1:{etcd_peer}",
            "--initial-cluster-state", "new"])
        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd}", "--bind-address=127.0.0.1", f"--secure-port={secure}",
            f"--tls-cert-file={self._work / 'apiserver.crt'}",
            f"--tls-private-key-file={self._work / 'apiserver.key'}",
            f"--service-cluster-ip-range={','.join(self._service_cidrs)}",
            f"--token-auth-file={self._work / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self._work / 'sa.pub'}",
            f"--service-account-signing-key-file={self._work / 'sa.key'}",
            # Its own address (the machine's, not loopback) stays out of the
            # `default/kubernetes` Service: no brain may program a way to it.
            "--endpoint-reconciler-type=none"])
        api = KubeApi(access)
        self._wait_ready(api)
        kubeconfig = self._work / "admin.kubeconfig"
        kubeconfig.write_text(access.kubeconfig())
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kubeconfig}", f"--controllers={CONTROLLERS}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"])
        # No serviceaccount controller runs: the default namespace's account by hand.
        api.create("/api/v1/namespaces/default/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        self.api = api
        return api

    def _spawn(self, binary: str, args: list[str]) -> None:
        self._procs.append(spawn(binary, in_cgroup(self.cgroup, [str(COMPONENTS / binary), *args]),
                                 self._work / "logs" / f"{binary}.log"))

    def _wait_ready(self, api: KubeApi) -> None:
        def ready() -> bool:
            for proc in self._procs:
                if not proc.running():
                    raise ControlPlaneError(proc.describe_exit())
            return api.ready()

        try:
            wait_until("the API server's /readyz", ready, READY_SECONDS)
        except TimeoutError as err:
            raise ControlPlaneError(f"{err}; its log: {self._work / 'logs'}") from None

    def relay_command(self) -> list[str]:
        """The command that brings the API server into a network namespace
        without a route to the machine's loopback (a node of the lab): run
        there, it listens on that namespace's 127.0.0.1 at the API server's
        port, so the same kubeconfig works in it. Its far end, a unix socket
        in the work directory relayed to the API server, starts with the
        first call, in the control plane's cgroup."""
        if self.api is None:
            raise ControlPlaneError("the control plane is not started: no API server to relay")
        port = urllib.parse.urlsplit(self.api.access.url).port
        if self._relay_socket is None:
            self._relay_socket = self._work / "api-relay.sock"
            self._procs.append(spawn("api-relay", in_cgroup(self.cgroup, [
                "socat", f"UNIX-LISTEN:{self._relay_socket},fork",
                f"TCP:127.0.0.1:{port}"]), self._work / "logs" / "api-relay.log"))
            wait_until("the API relay's socket", self._relay_socket.is_socket, 10.0)
        return ["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
                f"UNIX-CONNECT:{self._relay_socket}"]

    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs if proc.running()]

    def stop(self) -> None:
        """Stop what was started, the last first, and remove its cgroup."""
        for proc in reversed(self._procs):
            proc.stop()
        self._procs = []
        self._relay_socket = None
        if self.cgroup.is_dir():
            wait_until(f"cgroup {self.cgroup} empty",
                       lambda: not (self.cgroup / "cgroup.procs").read_text().strip(), 10.0)
            self.cgroup.rmdir()

    def __enter__(self) -> KubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_ports(count: int) -> list[int]:
    """`count` ports free on loopback now (the sockets that found them closed)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pki(work: Path) -> str:
    """The run's CA, the API server's certificate for 127.0.0.1, the
    service-account key pair and the token file; returns the admin token."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.crt", "-days", "2", "-subj", "/CN=kpng-py-lab-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out",
            "apiserver.csr", "-subj", "/CN=kube-apiserver")
    (work / "apiserver.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                        "extendedKeyUsage=serverAuth\n"
                                        "keyUsage=digitalSignature,keyEncipherment\n")
    openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "apiserver.crt", "-days", "2", "-extfile",
            "apiserver.ext")
    openssl("genrsa", "-out", "sa.key", "2048")
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    token = secrets.token_hex(24)
    (work / "tokens.csv").write_text(f"{token},admin,admin-uid,system:masters\n")
    return token


def slice_endpoints(slices: Sequence[dict]) -> Iterator[tuple[str, dict]]:
    """(address, conditions) of every endpoint of the slices."""
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or ():
            for address in endpoint["addresses"]:
                yield address, endpoint.get("conditions", {})
