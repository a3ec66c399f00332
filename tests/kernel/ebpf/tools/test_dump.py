"""`kpng-py ebpf dump` prints what the pinned maps hold, text and JSON, byte
for byte as reviewed in tests/kernel/ebpf/tools/dump/ (recorded before the
reading of the maps moved to backends/ebpf/maps/contents.py). The state is written entry by
entry, bypassing the programmer, so that it holds what a crash or a
neighbour can leave: a missing slot, a slot naming a missing endpoint or
another service's, slots above a master's count or without a master, an
unknown protocol, an affinity timeout without its flag, a service id of 0
or used twice, an endpoint no slot names, kind flags that disagree with
each other or with the address; and a frontend of each kind, with the
node-port addresses, the service port names of some ids, and counters:
added up over the CPUs, of a frontend used twice, of one that only
rejected, of an id no frontend has, and of an endpoint (not shown: the
programs are loaded, not attached, so none counts per endpoint and the dump
says n/a; tests/ebpf/tools/test_dump.py shows the counted form). A filter
that matches nothing exits 1 and says so."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from backends.ebpf.maps import id_maps, libbpf
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapAccess
from backends.ebpf.tools.dump import dump_json, format_text, read_dump
from kpng_py.model import Protocol, ServicePortName
from lab.procs import kpng_py_command
from tests.support.ebpf_datapath import loaded
from tests.support.ebpf_maps import SIZES, write_state

pytestmark = pytest.mark.kernel

EXPECTED = Path(__file__).parent / "dump"
NODE_ADDRESSES = ["fd00::5", "10.0.0.5", "127.0.0.1"]
# service id -> (translated, rejected) of the first CPU, and of the last.
COUNTERS = {7: ((3, 1), (2, 0)), 9: ((0, 4), (0, 0)), 999: ((1, 0), (0, 0))}


def write_counters(counters: MapAccess) -> None:
    cpus = libbpf.possible_cpus()
    values = []
    for first, last in COUNTERS.values():
        per_cpu = (maps.Counters * cpus)()
        per_cpu[0] = maps.Counters(*first)
        spread = per_cpu[cpus - 1]  # the first CPU's again on a one-CPU machine
        spread.translated += last[0]
        spread.rejected += last[1]
        values.append(per_cpu)
    counters.put_many(list(COUNTERS), values)


def write_endpoint_counters(endpoint_counters: MapAccess) -> None:
    """Endpoint 101 used 3 times, on the first CPU."""
    per_cpu = (maps.EndpointCounters * libbpf.possible_cpus())()
    per_cpu[0] = maps.EndpointCounters(3)
    endpoint_counters.put_many([101], [per_cpu])


def write_names(service_names: MapAccess) -> None:
    id_maps.write_names(service_names, [
        (7, ServicePortName("default", "web", "http", Protocol.TCP)),
        (8, ServicePortName("kube-system", "kube-dns", "dns", Protocol.UDP)),
        (14, ServicePortName("default", "web", "", Protocol.TCP))])


def write_node_addresses(node_addresses: MapAccess) -> None:
    node_addresses.put_many([maps.NodeAddressKey.of(ipaddress.ip_address(ip))
                             for ip in NODE_ADDRESSES],
                            [maps.NodeAddressValue() for _ in NODE_ADDRESSES])


@pytest.fixture(scope="module")
def dumped() -> Iterator[tuple[Path, dict]]:
    with loaded(**SIZES) as datapath:
        write_state(datapath.maps[maps.SERVICES.pin], datapath.maps[maps.ENDPOINTS.pin])
        write_node_addresses(datapath.maps[maps.NODE_ADDRESSES.pin])
        write_counters(datapath.maps[maps.COUNTERS.pin])
        write_names(datapath.maps[maps.SERVICE_NAMES.pin])
        write_endpoint_counters(datapath.maps[maps.ENDPOINT_COUNTERS.pin])
        yield datapath.config.bpffs_dir, read_dump(datapath.config.bpffs_dir)


def as_recorded(printed: str, bpffs_dir: Path) -> str:
    """The output with the test's own bpffs directory as the recording's."""
    return printed.replace(str(bpffs_dir), "/sys/fs/bpf/kpng-py-test")


@pytest.mark.parametrize("name, render", [("dump.txt", format_text), ("dump.json", dump_json)])
def test_the_dump_prints_what_it_printed_when_reviewed(dumped: tuple[Path, dict], name: str,
                                                       render) -> None:
    bpffs_dir, dump = dumped
    printed = as_recorded(render(dump) + "\n", bpffs_dir)
    assert printed == (EXPECTED / name).read_text()


def dumped_frontends(bpffs_dir: Path, *flags: str) -> list[str]:
    """`ebpf dump --json FLAGS`'s frontends, as "vip:port/protocol"; none
    when the dump says that nothing matches FLAGS (and exits 1)."""
    shown = subprocess.run(kpng_py_command("ebpf", "dump", "--json", *flags,
                                           "--bpffs-dir", str(bpffs_dir)),
                           capture_output=True, text=True, timeout=60)
    if shown.returncode == 1:
        assert shown.stdout == "" and shown.stderr == (
            f"kpng-py: error: not found: no frontend of the datapath under {bpffs_dir} "
            f"matches {' '.join(flags)}\n"), shown.stderr
        return []
    assert shown.returncode == 0, shown.stderr
    services = json.loads(shown.stdout)["services"]
    return [f"{svc['vip']}:{svc['port']}/{svc['protocol']}" for svc in services]


@pytest.mark.parametrize("vip, frontends", [
    ("10.96.0.10", ["10.96.0.10:80/TCP", "10.96.0.10:80/UDP"]),
    ("10.96.0.10:80", ["10.96.0.10:80/TCP", "10.96.0.10:80/UDP"]),
    ("10.96.0.10:81", []),
    ("203.0.113.7", ["203.0.113.7:80/TCP"]),  # an ExternalIP
    ("10.0.0.5:30080", ["0.0.0.0:30080/TCP"]),  # a node-port address: its family's node ports
    ("[fd00::5]:30080", [":::30080/TCP"]),
    ("10.96.0.99", []),
])
def test_the_dump_of_one_vip_keeps_what_a_client_reaches_there(dumped: tuple[Path, dict],
                                                               vip: str,
                                                               frontends: list[str]) -> None:
    assert dumped_frontends(dumped[0], "--vip", vip) == frontends


@pytest.mark.parametrize("service, frontends", [
    # Service id 7 (default/web:http) has two frontends here; 14 is the
    # unnamed port of default/web.
    ("default/web", ["0.0.0.0:30080/TCP", "10.96.0.10:80/TCP", "10.96.0.14:80/TCP"]),
    ("default/web:http", ["10.96.0.10:80/TCP", "10.96.0.14:80/TCP"]),
    ("default/we", []),
    ("kube-system/kube-dns", ["fd00::10:53/UDP"]),
])
def test_the_dump_of_one_service_keeps_only_its_frontends(dumped: tuple[Path, dict],
                                                          service: str,
                                                          frontends: list[str]) -> None:
    assert dumped_frontends(dumped[0], "--service", service) == frontends
