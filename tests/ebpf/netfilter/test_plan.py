"""Which objects a service port needs in the netfilter table, and what a
client from outside gets from them (pure: no kernel, no libnftables; the
order of the commands is test_txn.py's). The kernel tests
(tests/kernel/ebpf/netfilter/test_table.py) show the same commands work."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.ebpf.netfilter.plan import (
    NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    Chain,
    PortObjects,
)
from kpng_py.dataplane.print_backend import service_port_json
from kpng_py.model import (
    Endpoint,
    Endpoints,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortName,
    sorted_endpoints,
)
from tests.support.netfilter import SVC, change, ep, ip, objects, web


def test_losing_the_last_endpoint_moves_the_frontends_to_reject() -> None:
    commands = change(web(ep(2), external_ips=(ip("192.0.2.7"),)),
                      web(external_ips=(ip("192.0.2.7"),)))
    added = [c["add"]["element"] for c in commands if "element" in c.get("add", {})]
    assert {(e["name"], str(e["elem"][0][1])) for e in added} == {
        ("no-endpoint-services4", "{'goto': {'target': 'reject-chain'}}"),
        ("no-endpoint-nodeports4", "{'goto': {'target': 'reject-chain'}}")}
    deleted = [c["delete"]["element"]["name"] for c in commands
               if "element" in c.get("delete", {})]
    assert sorted(deleted) == ["service-ips4", "service-nodeports4"]


def test_etp_local_without_a_local_endpoint_drops_and_with_one_dnats_only_it() -> None:
    remote = ep(9, local=False, external=False)
    only_remote = objects(web(remote, external_traffic_local=True))
    assert {(e.map, e.kind) for e in only_remote.elements} == {("no-endpoint-nodeports4", "drop")}
    # Even a remote endpoint a brain left in the External scope is not used.
    mixed = objects(web(ep(2), ep(9, local=False), external_traffic_local=True))
    assert [c.name for c in mixed.chains] == [SVC, "ep4-ns/web/http/tcp/10.244.0.2/8080"]
    assert not any("mark-for-masquerade" in rule for rule in mixed.chains[0].rules)
    cluster = objects(web(ep(2)))
    assert "mark-for-masquerade" in cluster.chains[0].rules[0]


def test_source_ranges_make_a_firewall_for_lb_ips_only_and_bad_ones_are_reported() -> None:
    bad: list[str] = []
    port = web(ep(2), external_ips=(ip("192.0.2.7"),), load_balancer_ips=(ip("192.0.2.8"),),
               load_balancer_source_ranges=("10.0.0.0/8", "not-a-cidr"))
    made = objects(port, bad)
    assert bad == ["not-a-cidr"]
    firewall = {e.key for e in made.elements if e.map == "firewall-ips4"}
    assert firewall == {("192.0.2.8", "tcp", 80)}
    (fw,) = [c for c in made.chains if c.name.startswith("fw4-")]
    assert "10.0.0.0" in fw.rules[0] and "drop" in fw.rules[-1]


def test_dual_stack_ports_get_one_chain_per_family_with_its_own_endpoints() -> None:
    port = dataclasses.replace(web(ep(2), Endpoint(ip("fd00::2"), 8080, local=True)),
                               cluster_ips=(ip("10.96.0.1"), ip("fd96::1")),
                               node_port_families=(IPFamily.V4, IPFamily.V6))
    names = [c.name for c in objects(port).chains]
    assert names == [SVC, "ep4-ns/web/http/tcp/10.244.0.2/8080",
                     "svc6-ns/web/http/tcp", "ep6-ns/web/http/tcp/fd00..2/8080"]


def test_a_clusterip_only_port_owns_nothing() -> None:
    assert not objects(dataclasses.replace(web(ep(2)), node_port_families=()))


def test_a_name_that_is_no_dns_label_gets_a_hashed_chain_name() -> None:
    hostile = ServicePort(ServicePortName("ns", 'we b"; flush ruleset', "http", Protocol.TCP),
                          "NodePort", (ip("10.96.0.1"),), 80, node_port=30080,
                          node_port_families=(IPFamily.V4,), endpoints=Endpoints.of([ep(2)]))
    names = [c.name for c in objects(hostile).chains]
    assert len(names) == 2 and all(n.startswith(("svc4-h", "ep4-h")) for n in names)
    assert all(" " not in n and '"' not in n for n in names)
    other = dataclasses.replace(hostile, name=dataclasses.replace(hostile.name, port="dns"))
    assert objects(other).chains[0].name != names[0]


# -- the table holds what `to-print` shows for clients from outside ----------

def _lists(values: list, size: int = 2) -> st.SearchStrategy:
    return st.lists(st.sampled_from(values), max_size=size, unique=True).map(tuple)


outside_ports = st.builds(
    lambda endpoints, node_port_families, external_ips, lb_ips, etp, ranges: dataclasses.replace(
        web(*sorted_endpoints(endpoints)), node_port_families=node_port_families,
        external_ips=external_ips, load_balancer_ips=lb_ips, external_traffic_local=etp,
        load_balancer_source_ranges=ranges),
    st.lists(st.builds(Endpoint, st.sampled_from([ip("10.244.0.2"), ip("10.244.1.3"),
                                                   ip("fd00::2"), ip("fd00::1:3")]),
                       st.just(8080), st.booleans(), st.booleans(), st.booleans()),
             max_size=4, unique_by=lambda e: e.ip),
    _lists(list(IPFamily)), _lists([ip("192.0.2.7"), ip("2001:db8::7")]),
    _lists([ip("198.51.100.8"), ip("2001:db8::8")]), st.booleans(),
    _lists(["192.0.2.0/24", "2001:db8::/32", "bad"], 3))


def _exprs(chain: Chain) -> list[dict]:
    return [expr for rule in chain.rules for expr in json.loads(rule)]


def _table_says(made: PortObjects, family: IPFamily) -> dict:
    """What the table does with a packet from outside in `family`, in
    `to-print`'s words."""
    def chains(prefix: str) -> list[Chain]:
        return [c for c in made.chains if c.name.startswith(f"{prefix}{family.value}-")]
    verdicts = {"drop" if e.kind == "drop" else "reject" for e in made.elements
                if e.map == f"{NO_ENDPOINT_SERVICES}{family.value}"
                or e.map == f"{NO_ENDPOINT_NODEPORTS}{family.value}"}
    said: dict = {"externalEndpoints": sorted(
        str(Endpoint(ip(expr["dnat"]["addr"]), expr["dnat"]["port"]))
        for chain in chains("ep") for expr in _exprs(chain) if "dnat" in expr)}
    if verdicts:
        (said["externalNoEndpoints"],) = verdicts
    for chain in chains("fw"):
        said["loadBalancerSourceRanges"] = sorted(
            f"{member['prefix']['addr']}/{member['prefix']['len']}"
            for expr in _exprs(chain) if "match" in expr
            for member in expr["match"]["right"]["set"])
    return said


def _printed_says(printed: dict, family: IPFamily) -> dict:
    """The same from `to-print`'s line: its lists cut to `family`."""
    def of_family(values: list[str]) -> list[str]:
        # IPv6 addresses have two colons at least; `10.244.0.2:8080` has one.
        return [v for v in values if (v.count(":") > 1) == (family is IPFamily.V6)]
    said: dict = {"externalEndpoints": of_family(printed["externalEndpoints"])}
    verdict = printed.get("externalNoEndpoints", {}).get(f"IPv{family.value}")
    if verdict:
        said["externalNoEndpoints"] = verdict
    lb_ips = of_family(printed.get("loadBalancerIPs", []))
    if lb_ips and "loadBalancerSourceRanges" in printed:
        said["loadBalancerSourceRanges"] = of_family(printed["loadBalancerSourceRanges"])
    return said


@settings(max_examples=300, deadline=None)
@given(outside_ports)
def test_the_table_holds_what_to_print_shows_from_outside(port: ServicePort) -> None:
    """Per family served from outside: the endpoints the table DNATs to,
    what it does without one (drop or reject) and who its firewall admits
    are to-print's externalEndpoints, externalNoEndpoints and
    loadBalancerSourceRanges."""
    made, printed = objects(port, []), service_port_json(port)
    assert ("externalEndpoints" in printed) == bool(made) == bool(port.outside_families())
    for family in port.outside_families():
        assert _table_says(made, family) == _printed_says(printed, family), family
