"""The checks: docs/spec/service-behaviours.md, S1-S18, as the Kubernetes
e2e tests for Services run them (upstream test names in each check's
`upstream`).

Three services exist from the start (web, dns, echo: the first full sync);
checks that change them get them back afterwards. Every other service is
created by the check that needs it, as an e2e test creates its objects.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from e2e.expect import CheckEnv, CheckFailed, CheckRun, Env
from e2e.proxy import BackendKind
from e2e.statefile import (
    LOCAL_NODE,
    OTHER_ZONE,
    OTHER_ZONE_NODE,
    REMOTE_NODE,
    ZONE,
    ClusterState,
    EndpointRef,
    PortSpec,
    ServiceSpec,
)
from kpng_py.model import IPFamily
from lab import clients
from lab.clients import Sample, StreamingProbe, host_literal
from lab.cluster import ADDRESSING, Family, Pod
from lab.kube_proxy.node import KubeProxyRules
from lab.procs import Proc, in_namespace, run, wait_until
from lab.servers import ContainerPort

log = logging.getLogger(__name__)

HTTP = PortSpec("http", "TCP", 80, ContainerPort.HTTP)
ALT = PortSpec("alt", "TCP", 81, ContainerPort.ALT)
EXTRA = PortSpec("extra", "TCP", 82, ContainerPort.ALT)
DNS_UDP = PortSpec("dns", "UDP", 53, target_number=53)
DNS_TCP = PortSpec("dns-tcp", "TCP", 53, target_number=53)
ECHO_UDP = PortSpec("echo-udp", "UDP", 7001, ContainerPort.ECHO_UDP)
ECHO_TCP = PortSpec("echo-tcp", "TCP", 7000, ContainerPort.ECHO_TCP)

AFFINITY_TIMEOUT = 2          # seconds; e2e uses short timeouts too
AFFINITY_EXPIRY_ROUNDS = 10   # P(the same of 3 pods 10 times in a row) < 1e-4
UDP_FOLLOW_TIMEOUT = 60.0     # "within about a minute"
LARGE_DATAGRAM = 2000
SERVICE_PROXY_NAME = "service.kubernetes.io/service-proxy-name"


def base_state(families: tuple[Family, ...], servers: Sequence[Pod]) -> ClusterState:
    """The state of the first sync: services several checks use."""
    return ClusterState(families, (
        ServiceSpec("web", 0, (HTTP,)).with_endpoints(*servers),
        ServiceSpec("dns", 1, (DNS_UDP, DNS_TCP)).with_endpoints(*servers),
        ServiceSpec("echo", 2, (ECHO_UDP, ECHO_TCP)).with_endpoints(*servers),
    ))


def all_families(families: tuple[Family, ...]) -> tuple[Family, ...]:
    return families


def ipv4_only(families: tuple[Family, ...]) -> tuple[Family, ...]:
    return tuple(f for f in families if f is Family.IPV4)


def dual_only(families: tuple[Family, ...]) -> tuple[Family, ...]:
    return families if len(families) == 2 else ()


FamilyFilter = Callable[[tuple[Family, ...]], tuple[Family, ...]]
# Why a behaviour cannot apply to a backend (the check's result is then
# "n/a: <why>", neither a pass nor a failure), or None when it applies.
Applicability = Callable[[BackendKind], "str | None"]


def always(kind: BackendKind) -> str | None:
    return None


# The environment of a check's topology (Env: the service topology's).
EnvT = TypeVar("EnvT", bound=CheckEnv)


@dataclass(frozen=True)
class Check(Generic[EnvT]):
    name: str
    upstream: str  # the Kubernetes e2e test(s) it mirrors
    body: Callable[[CheckRun[EnvT]], None]
    families: FamilyFilter = all_families
    # Every packet of this check must be translated in the pod: none may
    # reach the node when the backend balances at the socket level.
    translated: bool = False
    not_applicable: Applicability = always
    # Why the Kubernetes API cannot say the states it makes (n/a under
    # `-c kube`; e2e.kube.NotExpressible says which ones it refuses).
    kube_cannot: str | None = None

    def why_not(self, kind: BackendKind, control_plane: str) -> str | None:
        """Why it cannot run with this backend and control plane (`-c`); None: it can."""
        if control_plane == "kube" and self.kube_cannot is not None:
            return f"the Kubernetes API cannot say it: {self.kube_cannot}"
        return self.not_applicable(kind)


CHECKS: list[Check[Env]] = []


def register_in(into: list[Check[EnvT]], name: str, upstream: str,
                families: FamilyFilter = all_families, translated: bool = False,
                not_applicable: Applicability = always, kube_cannot: str | None = None
                ) -> Callable[[Callable[[CheckRun[EnvT]], None]], Callable[[CheckRun[EnvT]], None]]:
    """Register the check in `into`, the checks of its topology."""
    def register(body: Callable[[CheckRun[EnvT]], None]) -> Callable[[CheckRun[EnvT]], None]:
        into.append(Check(name, upstream, body, families, translated, not_applicable,
                          kube_cannot))
        return body
    return register


def check(name: str, upstream: str, families: FamilyFilter = all_families,
          translated: bool = False, not_applicable: Applicability = always,
          kube_cannot: str | None = None
          ) -> Callable[[Callable[[CheckRun[Env]], None]], Callable[[CheckRun[Env]], None]]:
    """Register a check of the service topology (CHECKS)."""
    return register_in(CHECKS, name, upstream, families, translated, not_applicable,
                       kube_cannot)


# -- S1 ------------------------------------------------------------------
@check("S1/basic-endpoint", "should serve a basic endpoint from pods", translated=True)
def basic_endpoint(t: CheckRun[Env]) -> None:
    web, srv = t.env.shared("web"), t.env.servers
    t.each_family("3 endpoints", lambda f: t.expect_http(web, HTTP, f, srv))
    t.apply(web.with_endpoints(*srv[:2]))
    t.each_family(f"{srv[2].name} removed", lambda f: t.expect_http(web, HTTP, f, srv[:2]))
    t.apply(web)
    t.each_family(f"{srv[2].name} added back", lambda f: t.expect_http(web, HTTP, f, srv))


# -- S2, S3 --------------------------------------------------------------
def _multiport(t: CheckRun[Env]) -> ServiceSpec:
    return ServiceSpec("multi", 3, (HTTP, ALT)).with_endpoints(*t.env.servers)


@check("S2/multiport-endpoints", "should serve multiport endpoints from pods", translated=True)
def multiport(t: CheckRun[Env]) -> None:
    multi, srv = _multiport(t), t.env.servers
    t.apply(multi)
    t.each_family("port http (named, 8080+i)", lambda f: t.expect_http(multi, HTTP, f, srv))
    t.each_family("port alt (named, 9080+i)", lambda f: t.expect_http(multi, ALT, f, srv))


@check("S3/ports-added-and-deleted", "should be updated after adding or deleting ports")
def ports_added_and_deleted(t: CheckRun[Env]) -> None:
    multi, srv = _multiport(t), t.env.servers
    t.apply(multi)
    t.apply(multi.with_ports(HTTP))
    t.each_family("alt deleted: http still served", lambda f: t.expect_http(multi, HTTP, f, srv))
    t.each_family("alt deleted", lambda f: t.expect_not_served(multi, ALT, f))
    t.apply(multi.with_ports(HTTP, EXTRA))
    t.each_family("extra added", lambda f: t.expect_http(multi, EXTRA, f, srv))
    t.each_family("extra added: http still served", lambda f: t.expect_http(multi, HTTP, f, srv))


# -- S4 ------------------------------------------------------------------
@check("S4/same-port-tcp-and-udp", "should serve endpoints on same port and different protocols")
def same_port_tcp_and_udp(t: CheckRun[Env]) -> None:
    dns, srv = t.env.shared("dns"), t.env.servers
    t.each_family("dns over UDP", lambda f: t.expect_dns(dns, DNS_UDP, f, srv))
    t.each_family("dns over TCP", lambda f: t.expect_dns(dns, DNS_TCP, f, srv))
    t.apply(dns.with_ports(DNS_UDP))
    t.each_family("TCP port removed: UDP", lambda f: t.expect_dns(dns, DNS_UDP, f, srv))
    t.each_family("TCP port removed: TCP", lambda f: t.expect_not_served(dns, DNS_TCP, f))
    t.apply(dns.with_ports(DNS_TCP))
    t.each_family("UDP port removed: TCP", lambda f: t.expect_dns(dns, DNS_TCP, f, srv))
    t.each_family("UDP port removed: UDP", lambda f: t.expect_not_served(dns, DNS_UDP, f))


# -- S5 ------------------------------------------------------------------
@check("S5/service-down-and-up", "should be able to up and down services; "
       "should work after the service has been recreated")
def service_down_and_up(t: CheckRun[Env]) -> None:
    updown, srv = ServiceSpec("updown", 4, (HTTP,)).with_endpoints(*t.env.servers), t.env.servers
    t.apply(updown)
    t.each_family("created", lambda f: t.expect_http(updown, HTTP, f, srv))
    t.apply(delete=["updown"])
    t.each_family("deleted", lambda f: t.expect_not_served(updown, HTTP, f))
    t.apply(updown)
    t.each_family("re-created", lambda f: t.expect_http(updown, HTTP, f, srv))


# -- S6 ------------------------------------------------------------------
@check("S6/no-endpoints-rejected", "should be rejected when no endpoints exist", translated=True)
def no_endpoints_rejected(t: CheckRun[Env]) -> None:
    srv0 = t.env.servers[0]
    empty = ServiceSpec("empty", 5, (HTTP, DNS_UDP))
    t.apply(empty)
    t.each_family("no endpoints: TCP", lambda f: t.expect_rejected(empty, HTTP, f))
    t.each_family("no endpoints: UDP", lambda f: t.expect_rejected(empty, DNS_UDP, f))
    t.apply(empty.with_endpoints(srv0))
    t.each_family("endpoint added", lambda f: t.expect_http(empty, HTTP, f, [srv0]))
    t.each_family("endpoint added: UDP", lambda f: t.expect_dns(empty, DNS_UDP, f, [srv0]))
    t.apply(empty.with_endpoints(EndpointRef(srv0, ready=False)))
    t.each_family("only endpoint not ready", lambda f: t.expect_rejected(empty, HTTP, f))


# -- S7 ------------------------------------------------------------------
def _sticky(t: CheckRun[Env]) -> ServiceSpec:
    sticky = ServiceSpec("sticky", 6, (HTTP,), affinity_timeout=AFFINITY_TIMEOUT)
    return sticky.with_endpoints(*t.env.servers)


def _one_pod(t: CheckRun[Env], service: ServiceSpec, family: Family, among: Sequence[Pod]) -> str:
    """The one pod that a burst of new connections (one after the other) all reach."""
    names = {p.name for p in among}

    def problem(sample: Sample) -> str | None:
        if sample.failures or len(sample.pods) != 1:
            return f"expected every connection to reach the same pod; {sample.describe()}"
        if not set(sample.pods) <= names:
            return f"expected one of {', '.join(sorted(names))}; {sample.describe()}"
        return None

    target = service.cluster_ip(family)
    sample = t.eventually(f"{host_literal(target)}:{HTTP.port} with ClientIP affinity",
                        lambda: clients.http(t.env.client, target, HTTP.port, attempts=12,
                                             parallel=False), problem)
    return next(iter(sample.pods))


@check("S7/client-ip-affinity", "should have session affinity work for service with type "
       "clusterIP", translated=True)
def client_ip_affinity(t: CheckRun[Env]) -> None:
    sticky, srv = _sticky(t), t.env.servers
    t.apply(sticky)
    chosen: dict[Family, str] = {}

    def sticks(family: Family) -> None:
        chosen[family] = _one_pod(t, sticky, family, srv)

    t.each_family("burst of new connections", sticks)
    for family in t.active():  # affinity to a removed endpoint must go
        remaining = [p for p in srv if p.name != chosen[family]]
        t.apply(sticky.with_endpoints(*remaining))
        t.step(family, f"{chosen[family]} removed",
               functools.partial(_one_pod, t, sticky, family, remaining))
        t.apply(sticky)


@check("S7/affinity-timeout", "should have session affinity timeout work for service with "
       "type clusterIP", translated=True)
def affinity_timeout(t: CheckRun[Env]) -> None:
    sticky = _sticky(t)
    t.apply(sticky)
    seen: dict[Family, Counter[str]] = {f: Counter() for f in t.families}
    for _ in range(AFFINITY_EXPIRY_ROUNDS):
        pending = [f for f in t.active() if len(seen[f]) < 2]
        if not pending:
            return
        # Waiting out the affinity timeout is the behaviour under test.
        time.sleep(AFFINITY_TIMEOUT + 0.5)
        for family in pending:
            sample = clients.http(t.env.client, sticky.cluster_ip(family), HTTP.port)
            if sample.failures:
                t.fail(family, f"after {AFFINITY_TIMEOUT + 0.5} s idle: {sample.describe()}")
            seen[family].update(sample.pods)
    for family in t.active():
        if len(seen[family]) < 2:
            t.fail(family, f"after {AFFINITY_EXPIRY_ROUNDS} idle periods longer than the "
                           f"{AFFINITY_TIMEOUT} s timeout, every new connection still went to "
                           f"{', '.join(seen[family])}: affinity never expired")


# -- S8 ------------------------------------------------------------------
@check("S8/udp-recvfrom-shows-vip", "should function for pod-Service: udp; should be able to "
       "handle large requests: udp", translated=True)
def udp_recvfrom(t: CheckRun[Env]) -> None:
    echo = t.env.shared("echo")
    t.each_family(f"unconnected {LARGE_DATAGRAM}-byte datagram",
                  lambda f: _udp_echo(t, str(echo.cluster_ip(f)), connected=False))


@check("S8/getpeername-shows-vip", "should function for pod-Service: udp (connected "
       "sockets), tcp", translated=True)
def getpeername(t: CheckRun[Env]) -> None:
    echo = t.env.shared("echo")
    t.each_family(f"connected UDP, {LARGE_DATAGRAM}-byte datagram",
                  lambda f: _udp_echo(t, str(echo.cluster_ip(f)), connected=True))
    t.each_family("TCP", lambda f: _tcp_peer(t, str(echo.cluster_ip(f)), ECHO_TCP.port))


@check("S8/udp-spread", "should function for pod-Service: udp (new sockets spread over "
       "endpoints)", translated=True)
def udp_spread(t: CheckRun[Env]) -> None:
    dns = t.env.shared("dns")
    t.each_family("dig, a socket per query", lambda f: t.expect_dns(dns, DNS_UDP, f,
                                                                   t.env.servers))


def _udp_echo(t: CheckRun[Env], vip: str, connected: bool) -> None:
    args = ["udp-echo", vip, str(ECHO_UDP.port), "--size", str(LARGE_DATAGRAM)]
    want = [vip, ECHO_UDP.port]

    def problem(answer: dict) -> str | None:
        if not answer["ok"]:
            return f"no echo: {answer['errno']}"
        if not answer["equal"]:
            return f"echo differs from what was sent ({answer['size']} bytes back)"
        if answer["source"] != want:
            return f"recvfrom() says the reply came from {answer['source']}, expected {want}"
        if connected and answer["peer"] != want:
            return f"getpeername() says {answer['peer']}, expected {want}"
        return None

    t.eventually(f"{host_literal(vip)}:{ECHO_UDP.port}/UDP",
               lambda: clients.probe(t.env.client, *args, *(["--connected"] if connected
                                                            else [])), problem)


def _tcp_peer(t: CheckRun[Env], vip: str, port: int) -> None:
    want = [vip, port]

    def problem(answer: dict) -> str | None:
        if not answer["ok"]:
            return f"connect failed: {answer['errno']}"
        return None if answer["peer"] == want else f"getpeername() says {answer['peer']}"

    t.eventually(f"{host_literal(vip)}:{port}/TCP",
               lambda: clients.probe(t.env.client, "connect", vip, str(port)), problem)


# -- S9 ------------------------------------------------------------------
def _await(probe: StreamingProbe, what: str, ready: Callable[[], bool], timeout: float,
           seen: Callable[[], str]) -> None:
    """Wait for what a streaming probe shows; CheckFailed with what it showed."""
    try:
        wait_until(what, ready, timeout)
    except TimeoutError:
        crash = probe.crash()
        raise CheckFailed(f"{what}: not within {timeout:.0f} s; {seen()}"
                          + (f"; {crash}" if crash else "")) from None


def _udp_follows_new_endpoint(t: CheckRun[Env], connected: bool) -> None:
    old, new = t.env.servers[0], t.env.servers[1]
    cycle = ServiceSpec("cycle", 7, (DNS_UDP,))
    t.apply(cycle.with_endpoints(old))
    extra = ["--connected"] if connected else []
    follow_udp_socket(t, t.env.client,
                      lambda f: [str(cycle.cluster_ip(f)), str(DNS_UDP.port), *extra],
                      old, new, lambda: t.apply(cycle.with_endpoints(new)),
                      f"{old.name} replaced by {new.name}", UDP_FOLLOW_TIMEOUT)


def follow_udp_socket(t: CheckRun[CheckEnv], client: Pod, target: Callable[[Family], list[str]],
                      old: Pod, new: Pod, replace: Callable[[], None], step: str,
                      timeout: float) -> None:
    """One UDP socket per family (probe.py dns-follow `target(family)`) is
    answered by `old`; after `replace()` (old's endpoint replaced by new's),
    by `new` within `timeout` seconds."""
    probes = {f: StreamingProbe(client, "dns-follow", *target(f)) for f in t.active()}

    def answers_from(pod: Pod, family: Family, timeout: float) -> None:
        probe = probes[family]
        _await(probe, f"answers from {pod.name}",
               lambda: _last_answers(probe, 3) == [pod.name] * 3, timeout,
               lambda: f"last answers {_last_answers(probe, 5)}{_errors(probe)}")

    try:
        t.each_family("before the change", lambda f: answers_from(old, f, 5.0))
        # The pod cycles: its replacement has another address. The old server
        # keeps answering: only the proxy can move the socket on.
        replace()
        changed = time.monotonic()
        t.each_family(step, lambda f: answers_from(
            new, f, timeout - (time.monotonic() - changed)))
    finally:
        for probe in probes.values():
            probe.stop()


def _last_answers(probe: StreamingProbe, count: int) -> list[str | None]:
    answers = [line.get("pod", line.get("error")) for line in probe.lines() if "t" in line]
    return answers[-count:]


def _errors(probe: StreamingProbe) -> str:
    dropped = [line for line in probe.lines() if line.get("event") == "socket-dropped"]
    errors = Counter(line["error"] for line in probe.lines() if "error" in line)
    text = ", ".join(f"{e} x{n}" for e, n in errors.items())
    if dropped:
        text += f"; socket re-created {len(dropped)} times ({dropped[-1]['reason']})"
    return f" (errors: {text})" if text else ""


@check("S9/udp-connected-socket-follows-endpoint", "should be able to preserve UDP traffic "
       "when server pod cycles for a ClusterIP service (connected socket)", translated=True)
def udp_connected_follows(t: CheckRun[Env]) -> None:
    _udp_follows_new_endpoint(t, connected=True)


@check("S9/udp-unconnected-socket-follows-endpoint", "should be able to preserve UDP traffic "
       "when server pod cycles for a ClusterIP service (unconnected socket)", translated=True)
def udp_unconnected_follows(t: CheckRun[Env]) -> None:
    _udp_follows_new_endpoint(t, connected=False)


# -- S10 -----------------------------------------------------------------
@check("S10/internal-traffic-policy-local", "should respect internalTrafficPolicy=Local "
       "Pod to Pod", translated=True)
def internal_traffic_local(t: CheckRun[Env]) -> None:
    srv0, srv1, srv2 = t.env.servers
    local = ServiceSpec("local", 8, (HTTP,), internal_traffic_local=True)
    t.apply(local.with_endpoints(srv0, EndpointRef(srv1, REMOTE_NODE),
                                 EndpointRef(srv2, REMOTE_NODE)))
    t.each_family("one local endpoint of three", lambda f: t.expect_http(local, HTTP, f, [srv0]))
    t.apply(local.with_endpoints(*(EndpointRef(p, REMOTE_NODE) for p in t.env.servers)))
    t.each_family("no local endpoint, three remote", lambda f: _connect_fails(t, local, f))


def _connect_fails(t: CheckRun[Env], service: ServiceSpec, family: Family) -> None:
    target = str(service.cluster_ip(family))
    t.eventually(f"{host_literal(target)}:{HTTP.port} must fail",
               lambda: clients.probe(t.env.client, "connect", target, str(HTTP.port)),
               lambda a: f"connected to {a['peer']}" if a["ok"] else None)


# -- S11 -----------------------------------------------------------------
@check("S11/headless-and-externalname-ignored", "Headless / ExternalName ignored",
       kube_cannot="its ExternalName Service has a ClusterIP on purpose (so that programming "
                   "it would show), which the API refuses")
def headless_and_externalname(t: CheckRun[Env]) -> None:
    web, srv = t.env.shared("web"), t.env.servers
    headless = ServiceSpec("headless", 9, (HTTP,), headless=True).with_endpoints(*srv)
    # An ExternalName service has no ClusterIP; this one has one anyway so
    # that programming it by mistake would show.
    extname = ServiceSpec("extname", 10, (HTTP,), type="ExternalName").with_endpoints(*srv)
    t.apply(headless, extname)
    t.each_family("ExternalName's address", lambda f: t.expect_not_served(extname, HTTP, f))
    t.each_family("other services", lambda f: t.expect_http(web, HTTP, f, srv))


# -- S12 -----------------------------------------------------------------
@check("S12/ipv4-mapped-address", "Granular Checks: Services Secondary IP Family "
       "(IPv4 ClusterIP through an AF_INET6 socket)", families=ipv4_only, translated=True)
def ipv4_mapped(t: CheckRun[Env]) -> None:
    web, echo, srv = t.env.shared("web"), t.env.shared("echo"), t.env.servers

    def mapped(service: ServiceSpec) -> str:
        return f"::ffff:{service.cluster_ip(Family.IPV4)}"

    t.each_family("TCP (curl)", lambda f: t.expect_http(web, HTTP, f, srv, ip=mapped(web)))
    t.each_family("UDP recvfrom", lambda f: _udp_echo(t, mapped(echo), connected=False))
    t.each_family("UDP getpeername", lambda f: _udp_echo(t, mapped(echo), connected=True))


@check("S12/single-stack-services", "Granular Checks: Services Secondary IP Family "
       "(single-stack services in a dual-stack cluster)", families=dual_only, translated=True)
def single_stack_services(t: CheckRun[Env]) -> None:
    srv = t.env.servers
    single = {Family.IPV4: ServiceSpec("v4only", 13, (HTTP,), only_family=Family.IPV4),
              Family.IPV6: ServiceSpec("v6only", 14, (HTTP,), only_family=Family.IPV6)}
    single = {f: s.with_endpoints(*srv) for f, s in single.items()}
    t.apply(*single.values())
    t.each_family("own family", lambda f: t.expect_http(single[f], HTTP, f, srv))


# -- S13 -----------------------------------------------------------------
def _restart(t: CheckRun[Env], signum: signal.Signals) -> None:
    web, echo, srv = t.env.shared("web"), t.env.shared("echo"), t.env.servers
    control = t.env.control
    loops = {f: StreamingProbe(t.env.client, "http-loop", str(web.cluster_ip(f)), str(HTTP.port),
                               str(echo.cluster_ip(f)), str(ECHO_TCP.port))
             for f in t.active()}

    def served_and_changed(family: Family) -> None:
        """Ten new connections after the restart, none to the pod removed
        while the backend was down."""
        loop_served_since(loops[family], restarted,
                          f"ten new connections after the restart, none to {srv[2].name} "
                          f"(removed while the backend was down)",
                          lambda served: srv[2].name not in served[-10:])

    try:
        t.each_family("before the restart", lambda f: loop_under_way(loops[f]))
        if not t.active():
            return
        backend = control.backend
        assert backend is not None
        stop_backend(t, backend, signum)
        # While no backend runs, the service changes: the new process must
        # pick that up too.
        control.write_while_backend_down(control.state.with_service(web.with_endpoints(*srv[:2])))
        restarted = time.monotonic()
        control.start_backend()
        t.each_family("after the restart", served_and_changed)
    finally:
        lines = {f: loop.stop() for f, loop in loops.items()}
    for family in t.active():
        _judge_restart_loop(t, family, lines[family])


def loop_under_way(loop: StreamingProbe) -> None:
    """The restart loop (probe.py http-loop) has ten new connections served."""
    _await(loop, "the client loop under way", lambda: len(_served(loop)) >= 10, 10.0,
           lambda: _loop_summary(loop.lines()))


def loop_served_since(loop: StreamingProbe, since: float, what: str,
                      also: Callable[[list[str]], bool] = lambda served: True) -> None:
    """Ten new connections of the restart loop served after `since` (and
    `also` true of the pods that served them)."""
    _await(loop, what, lambda: len(_served(loop, since)) >= 10 and also(_served(loop, since)),
           20.0, lambda: _loop_summary([line for line in loop.lines()
                                        if line.get("t", 0) > since]))


def stop_backend(t: CheckRun[CheckEnv], backend: Proc, signum: signal.Signals) -> None:
    """Send `signum`; the backend must exit within 30 s, on SIGTERM with code
    0: otherwise it is killed and every active family fails."""
    backend.signal(signum)
    code = backend.wait_exit(30.0)
    if code is None or (signum == signal.SIGTERM and code != 0):
        backend.stop()
        for family in t.active():
            t.fail(family, f"on {signum.name} the backend ({backend.name}) "
                           + ("did not exit within 30 s" if code is None
                              else f"exited with code {code}"))


def _loop_summary(lines: list[dict]) -> str:
    outcomes = Counter(f"{line['kind']} {line.get('pod', 'ok') if line['ok'] else line['errno']}"
                       for line in lines if "kind" in line)
    return ", ".join(f"{what} x{n}" for what, n in sorted(outcomes.items())) or "no lines"


def _served(loop: StreamingProbe, since: float = 0.0) -> list[str]:
    """Pods that answered the loop's new connections made after `since`."""
    return [line["pod"] for line in loop.lines()
            if line.get("kind") == "new" and line["ok"] and line["t"] > since]


def loop_problems(lines: list[dict]) -> list[str]:
    """What went wrong in a client loop (probe.py http-loop): failed new
    connections, a broken established one."""
    new = [line for line in lines if line.get("kind") == "new"]
    established = [line for line in lines if line.get("kind") == "established"]
    failed_new = [line for line in new if not line["ok"]]
    failed_established = [line for line in established if not line["ok"]]
    problems = []
    if failed_new:
        errors = Counter(line["errno"] for line in failed_new)
        problems.append(f"{len(failed_new)} of {len(new)} new connections failed ("
                        + ", ".join(f"{e} x{n}" for e, n in errors.items()) + ")")
    if failed_established:
        problems.append(f"the established connection broke ({failed_established[0]['errno']}): "
                        f"{len(failed_established)} of {len(established)} exchanges failed")
    return problems


def _judge_restart_loop(t: CheckRun[CheckEnv], family: Family, lines: list[dict]) -> None:
    problems = loop_problems(lines)
    if problems and t.env.kind.survives_restart:
        t.fail(family, "; ".join(problems))
    elif problems:
        log.info("S13 %s: expected while a %s proxy restarts: %s", family.name,
                 t.env.kind.name, "; ".join(problems))


@check("S13/restart-sigterm", "should work after restarting kube-proxy (SIGTERM)",
       translated=True)
def restart_sigterm(t: CheckRun[Env]) -> None:
    _restart(t, signal.SIGTERM)


@check("S13/restart-sigkill", "should work after restarting kube-proxy (crash: SIGKILL)",
       translated=True)
def restart_sigkill(t: CheckRun[Env]) -> None:
    _restart(t, signal.SIGKILL)


# -- S14, S15 ------------------------------------------------------------
@check("S14/services-sharing-endpoints", "multiple services, same endpoints")
def services_sharing_endpoints(t: CheckRun[Env]) -> None:
    web, srv = t.env.shared("web"), t.env.servers
    web2 = ServiceSpec("web2", 11, (HTTP,)).with_endpoints(*srv)
    t.apply(web2)
    t.each_family("both", lambda f: t.expect_http(web2, HTTP, f, srv))
    t.apply(delete=["web2"])
    t.each_family("web2 deleted: web", lambda f: t.expect_http(web, HTTP, f, srv))
    t.each_family("web2 deleted: web2", lambda f: t.expect_not_served(web2, HTTP, f))


@check("S15/hairpin", "a pod reaching its own service may land on itself", translated=True)
def hairpin(t: CheckRun[Env]) -> None:
    web, srv = t.env.shared("web"), t.env.servers
    t.each_family(f"from {srv[0].name}", lambda f: t.expect_http(web, HTTP, f, srv,
                                                                 client=srv[0]))


# -- S16 -----------------------------------------------------------------
@check("S16/rolling-update-terminating-fallback", "should fallback to terminating endpoints "
       "when there are no ready endpoints with internalTrafficPolicy=Cluster (a rolling "
       "update under a steady stream of new connections: none fails)", translated=True)
def rolling_update(t: CheckRun) -> None:
    """The pod of a one-replica service is replaced: the old one terminates
    (ready false, still serving in its grace period) before its replacement
    is ready, then the new one is ready, then the old one is gone. A client
    makes a new connection every 100 ms throughout; none may fail."""
    old, new = t.env.servers[0], t.env.servers[1]
    rolling, echo = ServiceSpec("rolling", 17, (HTTP,)), t.env.shared("echo")
    terminating = EndpointRef(old, ready=False, terminating=True, serving=True)
    steps = ((f"{old.name} terminating, {new.name} not ready yet: the terminating one serves",
              (terminating, EndpointRef(new, ready=False)), old),
             (f"{new.name} ready, {old.name} still terminating", (terminating, EndpointRef(new)),
              new),
             (f"{old.name} gone", (EndpointRef(new),), new))
    t.apply(rolling.with_endpoints(old))
    loops = {f: StreamingProbe(t.env.client, "http-loop", str(rolling.cluster_ip(f)),
                               str(HTTP.port), str(echo.cluster_ip(f)), str(ECHO_TCP.port))
             for f in t.active()}
    try:
        t.each_family(f"{old.name} ready", lambda f: loop_served_since(
            loops[f], 0.0, f"ten new connections, all to {old.name}",
            lambda served: set(served) == {old.name}))
        for step, endpoints, serving in steps:
            t.apply(rolling.with_endpoints(*endpoints))
            since = t.env.control.synced_at
            t.each_family(step, lambda f, p=serving.name: loop_served_since(  # type: ignore[misc]  # mypy#15459
                loops[f], since, f"ten new connections, all to {p}",
                lambda served: set(served) == {p}))
    finally:
        lines = {f: loop.stop() for f, loop in loops.items()}
    for family in t.active():
        if problems := loop_problems(lines[family]):
            t.fail(family, "through the update: " + "; ".join(problems))


# -- S17 -----------------------------------------------------------------
def _hinted(pod: Pod, node: str, zone: str, same_node: bool, ready: bool = True) -> EndpointRef:
    """An endpoint with the hints the EndpointSlice controller gives it for
    PreferSameZone (its zone) or PreferSameNode (its node, and its zone)."""
    return EndpointRef(pod, node, ready=ready, hint_zones=(zone,),
                       hint_nodes=(node,) if same_node else ())


# A step of a check: its name, the service's endpoints, the pods that must answer.
Step = tuple[str, Sequence[EndpointRef], Sequence[Pod]]


def _http_steps(t: CheckRun, service: ServiceSpec, steps: Sequence[Step]) -> None:
    """Each step's endpoints applied in turn, and new connections reach its pods."""
    for step, endpoints, pods in steps:
        t.apply(service.with_endpoints(*endpoints))
        t.each_family(step, lambda f, p=pods: t.expect_http(  # type: ignore[misc]  # mypy#15459
            service, HTTP, f, p))


@check("S17/prefer-same-node", "traffic_distribution.go: should route traffic correctly "
       "between pods on multiple nodes when using PreferSameNode (and fall back to every "
       "endpoint when none is on the node)", translated=True)
def prefer_same_node(t: CheckRun) -> None:
    srv0, srv1, srv2 = t.env.servers
    far = [_hinted(p, OTHER_ZONE_NODE, OTHER_ZONE, same_node=True) for p in (srv1, srv2)]
    _http_steps(t, ServiceSpec("near-node", 18, (HTTP,), traffic_distribution="PreferSameNode"), (
        (f"{srv0.name} on this node", (_hinted(srv0, LOCAL_NODE, ZONE, True), *far), (srv0,)),
        (f"{srv0.name} not ready: every ready endpoint (another node and zone)",
         (_hinted(srv0, LOCAL_NODE, ZONE, True, ready=False), *far), (srv1, srv2))))


@check("S17/prefer-same-zone", "traffic_distribution.go: should route traffic to an endpoint "
       "in the same zone when using PreferSameZone (and fall back to every endpoint when none "
       "is in the zone)", translated=True)
def prefer_same_zone(t: CheckRun) -> None:
    srv0, srv1, srv2 = t.env.servers
    far = _hinted(srv2, OTHER_ZONE_NODE, OTHER_ZONE, same_node=False)
    same_zone = _hinted(srv1, REMOTE_NODE, ZONE, same_node=False)
    not_ready = _hinted(srv0, LOCAL_NODE, ZONE, same_node=False, ready=False)
    _http_steps(t, ServiceSpec("near-zone", 19, (HTTP,), traffic_distribution="PreferSameZone"), (
        (f"{srv0.name} and {srv1.name} in this node's zone",
         (_hinted(srv0, LOCAL_NODE, ZONE, same_node=False), same_zone, far), (srv0, srv1)),
        (f"{srv0.name} not ready: {srv1.name}, on another node of the zone",
         (not_ready, same_zone, far), (srv1,)),
        (f"none ready in the zone: {srv2.name}, of another zone", (not_ready, far), (srv2,))))


# -- S18 -----------------------------------------------------------------
@check("S18/service-proxy-name", "should implement service.kubernetes.io/service-proxy-name")
def service_proxy_name(t: CheckRun) -> None:
    srv = t.env.servers
    proxied = ServiceSpec("proxied", 20, (HTTP,)).with_endpoints(*srv)
    t.apply(proxied)
    t.each_family("no label: served", lambda f: t.expect_http(proxied, HTTP, f, srv))
    t.apply(dataclasses.replace(proxied, labels=((SERVICE_PROXY_NAME, "other"),)))
    t.each_family(f"labelled {SERVICE_PROXY_NAME}=other: another proxy's",
                  lambda f: t.expect_not_served(proxied, HTTP, f))
    t.apply(proxied)
    t.each_family("label removed: served again", lambda f: t.expect_http(proxied, HTTP, f, srv))


# -- counters ------------------------------------------------------------
# The backend's /metrics, where the e2e runs it: its default address, in the node.
METRICS_URL = "http://127.0.0.1:10249/metrics"
COUNTED_CONNECTIONS = 10
COUNTED_QUERIES = 6
COUNTED_REFUSALS = 4


def service_counters(t: CheckRun[Env]) -> dict[tuple[str, str, str], float]:
    """The backend's per-service-port counters: (metric, service_port,
    protocol) -> value."""
    cluster = t.env.cluster
    scraped = run(in_namespace(cluster.node_netns, ["curl", "--silent", "--show-error",
                                                    "--max-time", "5", METRICS_URL]),
                  timeout=10).stdout
    return {(sample.name, sample.labels["service_port"], sample.labels["protocol"]): sample.value
            for family in text_string_to_metric_families(scraped)
            if family.name in ("kpng_py_service_connections", "kpng_py_service_rejections")
            for sample in family.samples if sample.name.endswith("_total")}


def _counted(t: CheckRun[Env], family: Family, step: str, key: tuple[str, str, str], expected: int,
             make: Callable[[Family], int]) -> None:
    """`make(family)` makes some connections (returns how many it could); the
    counter at `key` must have grown by exactly `expected`."""
    def body() -> None:
        before = service_counters(t).get(key, 0)
        made = make(family)
        if made != expected:
            raise CheckFailed(f"the client made {made} of {expected}")
        grown = service_counters(t).get(key, 0) - before
        if grown != expected:
            raise CheckFailed(f"{key[0]}{{service_port={key[1]!r}, protocol={key[2]!r}}} grew by "
                              f"{grown:g}, expected {expected}")
    t.step(family, step, body)


@check("C1/connection-counters", "(kpng-py) per-service-port connection counters on /metrics "
       "count what real clients did", translated=True)
def connection_counters(t: CheckRun[Env]) -> None:
    srv = t.env.servers
    counted = ServiceSpec("counted", 12, (HTTP, DNS_UDP)).with_endpoints(*srv)
    refusing = ServiceSpec("refusing", 15, (HTTP,))
    t.apply(counted, refusing)
    connections = "kpng_py_service_connections_total"
    for family in t.active():
        _counted(t, family, f"{COUNTED_CONNECTIONS} curl connections",
                 (connections, "default/counted:http", "TCP"), COUNTED_CONNECTIONS,
                 lambda f: len(clients.http(t.env.client, counted.cluster_ip(f), HTTP.port,
                                            COUNTED_CONNECTIONS).answers))
        _counted(t, family, f"{COUNTED_QUERIES} dig queries, a socket each",
                 (connections, "default/counted:dns", "UDP"), COUNTED_QUERIES,
                 lambda f: sum(clients.dns(t.env.client, counted.cluster_ip(f), DNS_UDP.port,
                                           attempts=COUNTED_QUERIES).pods.values()))
        # Refused in the pod's kernel by eBPF (counted); a userspace proxy
        # has no listener without endpoints, so the node's kernel refuses
        # them unseen (not counted).
        refusals = COUNTED_REFUSALS if t.env.kind.translates_in_pod else 0
        _counted(t, family, f"{COUNTED_REFUSALS} connects refused",
                 ("kpng_py_service_rejections_total", "default/refusing:http", "TCP"), refusals,
                 lambda f: refusals if all(
                     clients.probe(t.env.client, "connect", str(refusing.cluster_ip(f)),
                                   str(HTTP.port))["errno"] == "ECONNREFUSED"
                     for _ in range(COUNTED_REFUSALS)) else -1)
    t.apply(delete=["counted", "refusing"])
    t.each_family("deleted: no longer exported", lambda f: _not_exported(t, "default/counted:http"))


def _not_exported(t: CheckRun[Env], service_port: str) -> None:
    left = [key for key in service_counters(t) if key[1] == service_port]
    if left:
        raise CheckFailed(f"still exported after the service was deleted: {left}")


# -- trace ---------------------------------------------------------------
TRACED_CONNECTIONS = 3
TRACED_QUERIES = 2


def no_trace(kind: BackendKind) -> str | None:
    return None if kind.lab.trace else f"the {kind.name} backend has no trace command"


def _traced_lines(trace: Proc) -> list[dict]:
    """The JSON lines of the trace's output (its log also has its stderr)."""
    return [json.loads(line) for line in trace.log.read_text().splitlines()
            if line.startswith("{")]


@check("C2/trace-shows-translations", "(kpng-py) `kpng-py ebpf trace` shows one line per "
       "translation of real clients", translated=True, not_applicable=no_trace)
def trace_shows_translations(t: CheckRun[Env]) -> None:
    cluster, srv, client = t.env.cluster, t.env.servers, t.env.client
    traced = ServiceSpec("traced", 16, (HTTP, DNS_UDP)).with_endpoints(*srv)
    t.apply(traced)
    trace_command = t.env.kind.lab.trace
    assert trace_command is not None  # without one, no_trace makes the check n/a
    command = trace_command(cluster.names.places)
    trace = cluster.spawn_on_node("trace", [*command, "--service", "default/traced"])
    try:
        wait_until("the trace attached", lambda: "tracing" in trace.log.read_text(), 30.0)
        made = {f: (len(clients.http(client, traced.cluster_ip(f), HTTP.port,
                                     TRACED_CONNECTIONS, parallel=False).answers),
                    sum(clients.dns(client, traced.cluster_ip(f), DNS_UDP.port,
                                    attempts=TRACED_QUERIES).pods.values()))
                for f in t.active()}
    finally:
        trace.stop()
    lines = _traced_lines(trace)
    addresses = {str(ip) for pod in srv for ip in pod.ips}
    for family in t.active():
        t.step(family, "trace lines", functools.partial(
            _expect_traced, lines, traced, family, client, addresses, made[family]))


def _expect_traced(lines: list[dict], traced: ServiceSpec, family: Family, client: Pod,
                   addresses: set[str], made: tuple[int, int]) -> None:
    connections, queries = made
    if made != (TRACED_CONNECTIONS, TRACED_QUERIES):
        raise CheckFailed(f"the clients made {connections} connections and {queries} queries "
                          f"of {TRACED_CONNECTIONS} and {TRACED_QUERIES}")
    vip = clients.host_literal(traced.cluster_ip(family))
    hook = "4" if family is Family.IPV4 else "6"
    for protocol, port, count, name in (("TCP", HTTP.port, connections, "default/traced:http"),
                                        ("UDP", DNS_UDP.port, queries, "default/traced:dns")):
        mine = [line for line in lines if line["vip"] == f"{vip}:{port}"]
        bad = [line for line in mine if not (
            line["protocol"] == protocol and line["servicePort"] == name
            and line["verdict"] == "translated" and line["hook"].endswith(hook)
            and line["backend"].rpartition(":")[0].strip("[]") in addresses
            and line["cgroup"].endswith("/" + client.cgroup.name))]
        if len(mine) < count or bad:
            raise CheckFailed(f"{vip}:{port}/{protocol}: {len(mine)} trace lines for {count} "
                              f"sockets; not as expected: {bad[:2]}")
        commands = {line["comm"] for line in mine}
        if protocol == "TCP" and commands != {"curl"}:
            raise CheckFailed(f"TCP lines name {sorted(commands)}, not curl")


# -- M1: migration, upgrade, rollback --------------------------------------
# The flag that makes a restart of the eBPF backend load a new build of its
# programs (another cflag), as an upgrade to a new image does.
UPGRADE_FLAGS = ("--endpoint-counters",)
KUBE_FAMILY = {Family.IPV4: IPFamily.V4, Family.IPV6: IPFamily.V6}


def survives_no_restart(kind: BackendKind) -> str | None:
    return None if kind.survives_restart else (
        f"the {kind.name} backend's listeners close when it stops (S13): its upgrade and its "
        "removal have a window by design; docs/deploy.md's migration is to-ebpf's")


@check("M1/migration-upgrade-rollback",
       "(kpng-py) docs/deploy.md: from kube-proxy to kpng-py, an upgrade, its rollback and "
       "back to kube-proxy, with no failed connection", not_applicable=survives_no_restart)
def migration_upgrade_rollback(t: CheckRun[Env]) -> None:
    """kube-proxy (its iptables mode's rules for this node, loaded as it
    loads them) and kpng-py each serve while the other comes and goes, under
    a client loop of new connections and one long-lived connection."""
    web, echo, control = t.env.shared("web"), t.env.shared("echo"), t.env.control
    cluster = t.env.cluster
    kube_proxy = KubeProxyRules(cluster.node_netns, {
        KUBE_FAMILY[f]: str(ADDRESSING[f].cluster_pod_cidr) for f in t.families})
    loops = {f: StreamingProbe(t.env.client, "http-loop", str(web.cluster_ip(f)), str(HTTP.port),
                               str(echo.cluster_ip(f)), str(ECHO_TCP.port))
             for f in t.active()}

    def served(step: str, by_kube_proxy: bool) -> None:
        """New connections served after `step`; by kube-proxy (the node got
        packets to the ClusterIPs) or by kpng-py in the pod (it got none)."""
        since, escaped = time.monotonic(), {f: cluster.escaped_packets(f) for f in t.active()}
        t.each_family(step, lambda f: loop_served_since(loops[f], since, step))
        t.each_family(step, lambda f: _served_by(cluster.escaped_packets(f) - escaped[f],
                                                  by_kube_proxy))

    def stopped_and_removed() -> None:
        backend = control.backend
        assert backend is not None
        stop_backend(t, backend, signal.SIGTERM)
        t.env.kind.dataplane_cleanup(cluster.names)

    try:
        t.each_family("before", lambda f: loop_under_way(loops[f]))
        # A node on kube-proxy alone: its rules go in beside kpng-py, which goes.
        kube_proxy.sync(control.service_ports())
        stopped_and_removed()
        served("kube-proxy alone", by_kube_proxy=True)
        # The migration: kpng-py starts beside kube-proxy, then kube-proxy's rules go.
        control.start_backend()
        kube_proxy.cleanup()
        served("migrated: kpng-py alone", by_kube_proxy=False)
        # An upgrade to a new build, and its rollback.
        stop_backend(t, control.backend_of(control.seats[0]), signal.SIGTERM)
        control.start_backend(flags=UPGRADE_FLAGS)
        served("upgraded", by_kube_proxy=False)
        stop_backend(t, control.backend_of(control.seats[0]), signal.SIGTERM)
        control.start_backend()
        served("rolled back", by_kube_proxy=False)
        # Back to kube-proxy: its rules go in first, then kpng-py is removed.
        kube_proxy.sync(control.service_ports())
        stopped_and_removed()
        served("back on kube-proxy", by_kube_proxy=True)
    finally:
        lines = {f: loop.stop() for f, loop in loops.items()}
        if control.backend is None or not control.backend.running():
            control.start_backend()  # the next checks run on kpng-py alone
        kube_proxy.cleanup()
    for family in t.active():
        _judge_restart_loop(t, family, lines[family])
        log.info("M1 %s: %s", family.name, _loop_summary(lines[family]))


def _served_by(escaped: int, kube_proxy: bool) -> None:
    if kube_proxy and not escaped:
        raise CheckFailed("no packet to a ClusterIP reached the node: kube-proxy's rules "
                          "served nothing (kpng-py still translating?)")
    if not kube_proxy and escaped:
        raise CheckFailed(f"{escaped} packets to ClusterIPs reached the node: kpng-py did "
                          "not translate them in the pod")
