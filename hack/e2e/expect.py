"""What a check needs: the cluster, state changes that wait for the backend's
sync, and expectations that poll the observable effect with a deadline.

A check's scenario runs once; its expectations run for every IP family of
the cluster and each family gets its own verdict (dual-stack runs every
check on both families). A family that failed is not probed again in that
check: its first failure is the one reported.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Protocol, Sequence, TypeVar

from e2e.proxy import BackendKind, ControlPlane, SyncError
from e2e.statefile import ClusterState, PortSpec, ServiceSpec
from lab import clients
from lab.clients import Sample
from lab.cluster import Cluster, Family, IPAddress, Pod

# An expectation keeps sampling until EFFECT_TIMEOUT seconds after the backend
# logged its last sync, and at least MIN_RETRY seconds: a change shows at once
# after the sync, but a proxy may finish the work its sync started a moment
# later (e.g. open a listener); nothing else is waited for.
EFFECT_TIMEOUT = 3.0
MIN_RETRY = 1.0
DNS_PORT = 53  # service ports numbered 53 speak DNS, other TCP ports HTTP
SPREAD_ATTEMPTS = 24  # P(one of 3 endpoints unseen) = 3 * (2/3)^24 < 2e-4 per try


T = TypeVar("T")


class CheckFailed(Exception):
    pass


@dataclass(frozen=True)
class Env:
    cluster: Cluster
    control: ControlPlane
    kind: BackendKind
    servers: tuple[Pod, ...]
    client: Pod
    base_state: ClusterState

    @property
    def families(self) -> tuple[Family, ...]:
        return self.cluster.families

    def shared(self, name: str) -> ServiceSpec:
        return next(s for s in self.base_state.services if s.name == name)


class CheckEnv(Protocol):
    """What CheckRun needs of a topology's environment (Env, or the NodePort
    topology's e2e.topology.NodePortEnv)."""

    @property
    def control(self) -> ControlPlane: ...

    @property
    def client(self) -> Pod: ...  # the default client of expectations

    @property
    def kind(self) -> BackendKind: ...


# A topology's environment, as its checks see it (covariant: a helper that
# needs only CheckEnv takes any topology's run).
EnvT_co = TypeVar("EnvT_co", bound=CheckEnv, covariant=True)


class CheckRun(Generic[EnvT_co]):
    """One check's run: its families, their verdicts so far, its actions."""

    def __init__(self, env: EnvT_co, families: Sequence[Family]) -> None:
        self.env = env
        self.families = tuple(families)
        self.failures: dict[Family, str] = {}

    # -- verdicts ---------------------------------------------------------
    def active(self) -> list[Family]:
        return [f for f in self.families if f not in self.failures]

    def fail(self, family: Family, message: str) -> None:
        self.failures.setdefault(family, message)

    def step(self, family: Family, step: str, expectation: Callable[[], object]) -> None:
        """Run one expectation for `family` unless that family already failed."""
        if family in self.failures:
            return
        try:
            expectation()
        except CheckFailed as err:
            self.fail(family, f"{step}: {err}")

    def each_family(self, step: str, expectation: Callable[[Family], object]) -> None:
        for family in self.active():
            self.step(family, step, functools.partial(expectation, family))

    # -- state ------------------------------------------------------------
    @property
    def state(self) -> ClusterState:
        return self.env.control.state

    def apply(self, *services: ServiceSpec, delete: Iterable[str] = ()) -> None:
        """Create/update `services`, delete services named in `delete`, in one
        save of the state file; wait for the backend to apply it."""
        state = self.state
        for name in delete:
            state = state.without_service(name)
        for service in services:
            state = state.with_service(service)
        try:
            self.env.control.apply(state)
        except SyncError as err:
            raise CheckFailed(str(err)) from err

    # -- expectations -----------------------------------------------------
    def eventually(self, what: str, sample: Callable[[], T],
                   problem: Callable[[T], str | None]) -> T:
        """Sample until `problem(sample)` is None and return that sample;
        CheckFailed with the last problem once the deadline passed."""
        deadline = max(self.env.control.synced_at + EFFECT_TIMEOUT,
                       time.monotonic() + MIN_RETRY)
        while True:
            seen = sample()
            trouble = problem(seen)
            if trouble is None:
                return seen
            if time.monotonic() > deadline:
                raise CheckFailed(f"{what}: {trouble}")
            time.sleep(0.1)

    def expect_http(self, service: ServiceSpec, port: PortSpec, family: Family,
                    pods: Sequence[Pod], client: Pod | None = None,
                    ip: IPAddress | str | None = None) -> Sample:
        """New connections reach every pod of `pods` and only them, each on its
        backend port for `port` and its address of `family`."""
        target = ip if ip is not None else service.cluster_ip(family)
        by_name = {p.name: p for p in pods}

        def problem(sample: Sample) -> str | None:
            if sample.failures:
                return sample.describe()
            if set(sample.pods) != set(by_name):
                return f"expected {', '.join(sorted(by_name))}; {sample.describe()}"
            for answer in sample.answers:
                pod = by_name[answer.pod]
                want = (port.backend_port(pod), pod.ip(family))
                if (answer.port, answer.server_ip) != want:
                    return (f"{answer.pod} answered on {answer.server_ip} port {answer.port}, "
                            f"expected {want[1]} port {want[0]}")
            return None

        attempts = SPREAD_ATTEMPTS if len(pods) > 1 else 4
        return self.eventually(
            f"{_where(target, port)} from {(client or self.env.client).name}",
            lambda: clients.http(client or self.env.client, target, port.port, attempts), problem)

    def expect_dns(self, service: ServiceSpec, port: PortSpec, family: Family,
                   pods: Sequence[Pod]) -> Sample:
        """DNS queries (over `port`'s protocol) are answered by exactly `pods`."""
        names = {p.name for p in pods}
        target = service.cluster_ip(family)

        def problem(sample: Sample) -> str | None:
            if sample.failures or set(sample.pods) != names:
                return f"expected {', '.join(sorted(names))}; {sample.describe()}"
            return None

        attempts = SPREAD_ATTEMPTS if len(pods) > 1 else 4
        return self.eventually(
            f"dig {'+tcp ' if port.protocol == 'TCP' else ''}{_where(target, port)}",
            lambda: clients.dns(self.env.client, target, port.port, port.protocol == "TCP",
                                attempts), problem)

    def expect_not_served(self, service: ServiceSpec, port: PortSpec, family: Family) -> Sample:
        """Nothing answers on the ClusterIP port any more (any failure will do:
        refused, unreachable, timeout)."""
        target = service.cluster_ip(family)

        if port.port != DNS_PORT and port.protocol != "TCP":
            raise ValueError(f"no client for {port}: DNS or HTTP ports only")

        def sample() -> Sample:
            if port.port == DNS_PORT:
                return clients.dns(self.env.client, target, port.port,
                                   tcp=port.protocol == "TCP", attempts=2)
            return clients.http(self.env.client, target, port.port, attempts=2)

        return self.eventually(f"{_where(target, port)} no longer served", sample,
                          lambda s: s.describe() if s.pods else None)

    def expect_rejected(self, service: ServiceSpec, port: PortSpec, family: Family) -> dict:
        """connect() (TCP) or the first exchange (UDP) fails at once with
        ECONNREFUSED."""
        target = service.cluster_ip(family)
        udp = ["--udp"] if port.protocol == "UDP" else []
        return self.eventually(f"{_where(target, port)} rejected with ECONNREFUSED within 1 s",
                          lambda: clients.probe(self.env.client, "connect", str(target),
                                                str(port.port), *udp), refused_at_once)


def refused_at_once(answer: dict) -> str | None:
    """What is wrong with a probe.py connect answer, unless it was refused
    (ECONNREFUSED) within 1 s."""
    if answer["ok"]:
        return f"connected (peer {answer['peer']})"
    if answer["errno"] != "ECONNREFUSED" or answer["seconds"] > 1.0:
        return f"failed with {answer['errno']} after {answer['seconds']:.2f} s"
    return None


def _where(ip: IPAddress | str, port: PortSpec) -> str:
    return f"{clients.host_literal(ip)}:{port.port}/{port.protocol}"
