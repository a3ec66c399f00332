"""kube-proxy's rulesets as the bench generates them: chain names, structure
and partial syncs as kube-proxy's proxiers write them, and (as root) that the
kernel's tools accept them."""

from __future__ import annotations

import re

from bench.scenario import Scenario
from kpng_py.model import IPFamily, ServicePort
from lab.kube_proxy import KubeServicePort
from lab.kube_proxy import iptables as ipt
from lab.kube_proxy import nftables as nft
from lab.kube_proxy.iptables import IptablesProxier
from lab.kube_proxy.nftables import NftablesProxier
from lab.kube_proxy.node import cleanup_input
from tests.support.kube_proxy import CLUSTER_CIDR, SVC1, V6, cluster_ip_port


def _ipv4(port: ServicePort) -> KubeServicePort:
    """The IPv4 view of a port with an IPv4 ClusterIP."""
    view = KubeServicePort.of(port)
    assert view is not None, f"{port.name} has no IPv4 ClusterIP"
    return view


SVC2 = cluster_ip_port("svc2", "172.30.0.42", "10.180.0.4:80")
EMPTY = cluster_ip_port("svc3", "172.30.0.43")


def test_chain_names_are_kube_proxys():
    """The names kube-proxy's own tests expect for ns1/svc1:p80 and 10.180.0.1:80."""
    svc1 = _ipv4(SVC1)
    assert ipt.service_chain(svc1) == "KUBE-SVC-XPGD46QRK7WJZT7O"
    assert ipt.endpoint_chain(svc1, "10.180.0.1:80") == "KUBE-SEP-SXIVWICOYRO3J4NJ"
    assert nft.service_chain(svc1) == "service-ULMVA6XW-ns1/svc1/tcp/p80"
    assert nft.endpoint_chain(svc1, "10.180.0.1:80") == \
        "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"


def _rules(text: str, chain: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"-A {chain} ")]


def test_iptables_full_sync_is_services_to_svc_to_sep():
    text = IptablesProxier(CLUSTER_CIDR).full_sync([SVC1, SVC2, EMPTY])
    tables = re.findall(r"^\*(\w+)$", text, re.M)
    assert tables == ["filter", "nat"] and text.count("COMMIT") == 2
    svc1 = _ipv4(SVC1)
    svc_chain = ipt.service_chain(svc1)
    services = _rules(text.split("*nat")[1], "KUBE-SERVICES")
    assert services[0] == ('-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" '
                           f'-m tcp -p tcp -d 172.30.0.41 --dport 80 -j {svc_chain}')
    assert "KUBE-NODEPORTS" in services[-1] and len(services) == 3  # svc1, svc2, nodeports
    chain = _rules(text, svc_chain)
    assert chain[0].endswith(f"--dport 80 ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ")
    seps = [ipt.endpoint_chain(svc1, f"10.180.0.{i}:80") for i in (1, 2, 3)]
    # endpoint i of n with probability 1/(n-i), the last one unconditionally
    assert "--probability 0.3333333333 -j " + seps[0] in chain[1]
    assert "--probability 0.5000000000 -j " + seps[1] in chain[2]
    assert "statistic" not in chain[3] and chain[3].endswith(f"-j {seps[2]}")
    assert _rules(text, seps[0]) == [
        f"-A {seps[0]} -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ",
        f"-A {seps[0]} -m comment --comment ns1/svc1:p80 -m tcp -p tcp "
        "-j DNAT --to-destination 10.180.0.1:80"]
    # no endpoints: rejected in the filter table, nothing in nat
    assert any("ns1/svc3:p80 has no endpoints" in r and r.endswith("-j REJECT")
               for r in _rules(text.split("*nat")[0], "KUBE-SERVICES"))
    assert "172.30.0.43" not in text.split("*nat")[1]


def test_iptables_large_cluster_drops_endpoint_comments():
    ports = Scenario(101, 10).service_ports()  # 1010 endpoints: above kube-proxy's 1000
    text = IptablesProxier(CLUSTER_CIDR).full_sync(ports)
    first = _ipv4(ports[0])
    sep = ipt.endpoint_chain(first, first.endpoints[0])
    assert all("comment" not in rule for rule in _rules(text, sep))
    assert all("comment" not in rule for rule in _rules(text, ipt.service_chain(first))[1:])


def test_iptables_partial_sync_rewrites_services_and_the_changed_chains_only():
    scenario = Scenario(20, 3)
    ports = scenario.service_ports()
    before, after = scenario.endpoint_moves()
    ports[scenario.changed_index()] = after
    text = IptablesProxier(CLUSTER_CIDR).partial_sync(ports, [(before, after)])
    changed = _ipv4(after)
    declared = re.findall(r"^:(KUBE-(?:SVC|SEP)-\w+)", text, re.M)
    assert declared == [ipt.service_chain(changed),
                        *(ipt.endpoint_chain(changed, ep) for ep in changed.endpoints)]
    # KUBE-SERVICES is flushed by its chain line, so all of it is written again
    assert len(_rules(text, "KUBE-SERVICES")) == 20 + 1


def test_jump_rules_hook_kube_proxys_chains_in():
    text = IptablesProxier(CLUSTER_CIDR).jump_rules()
    assert ('-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
            in text.splitlines())
    assert "-I POSTROUTING -m comment --comment \"kubernetes postrouting rules\" " \
           "-j KUBE-POSTROUTING" in text


def test_nftables_full_sync_dispatches_through_the_service_map():
    text = NftablesProxier(CLUSTER_CIDR, "172.30.0.0/16").full_sync([SVC1, SVC2, EMPTY])
    lines = text.splitlines()
    svc1 = _ipv4(SVC1)
    svc_chain = nft.service_chain(svc1)
    element = (f"add element ip kube-proxy service-ips {{ 172.30.0.41 . tcp . 80 : "
               f"goto {svc_chain} }}")
    assert element in lines
    # chains exist before the element and the rules that refer to them
    assert lines.index(f"add chain ip kube-proxy {svc_chain}") < lines.index(element)
    picks = [line for line in lines if "numgen random mod" in line and svc_chain in line]
    assert len(picks) == 1 and "numgen random mod 3 vmap { 0 : goto endpoint-" in picks[0]
    assert ("add rule ip kube-proxy services ip daddr . meta l4proto . th dport "
            "vmap @service-ips") in lines
    assert (f"add rule ip kube-proxy {nft.endpoint_chain(svc1, '10.180.0.2:80')} "
            "meta l4proto tcp dnat to 10.180.0.2:80") in lines
    assert any(line.startswith("add element ip kube-proxy no-endpoint-services "
                               "{ 172.30.0.43 . tcp . 80 : goto reject-chain") for line in lines)


def test_nftables_partial_sync_touches_the_changed_service_only():
    scenario = Scenario(20, 3)
    before, after = scenario.endpoint_moves()
    text = NftablesProxier(CLUSTER_CIDR, "10.96.0.0/16").partial_sync([(before, after)])
    old, new = _ipv4(before), _ipv4(after)
    assert "add table" not in text and "service-ips" not in text  # same VIP: element kept
    chains = set(re.findall(r"chain ip kube-proxy (\S+)", text))
    gone = nft.endpoint_chain(old, old.endpoints[0])
    assert chains == {nft.service_chain(new), gone,
                      *(nft.endpoint_chain(new, ep) for ep in new.endpoints)}
    assert f"flush chain ip kube-proxy {gone}" in text.splitlines()
    assert f"add rule ip kube-proxy {gone}" not in text


def test_the_ipv6_proxier_writes_ip6tables_rules():
    """kube-proxy runs one proxier per family; the e2e's migration check
    loads both (lab/kube_proxy/node.py)."""
    text = IptablesProxier("fd00:10:244::/56", IPFamily.V6).full_sync([SVC1, V6])
    assert "172.30.0.41" not in text  # an IPv4-only port has no IPv6 rules
    assert "127.0.0.0/8" not in text  # kubelet's localnet guard is IPv4's
    assert "-d fd00:10:96::41 --dport 80" in text
    assert "-s fd00:10:244::1 -j KUBE-MARK-MASQ" in text
    assert "-j DNAT --to-destination [fd00:10:244::2]:80" in text
    assert ipt.restore_command("nft", IPFamily.V6)[0] == "ip6tables-nft-restore"


SAVED = """# Generated by iptables-nft-save
*filter
:INPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A INPUT -s 10.0.0.1 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:OTHER - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j OTHER
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-X
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
COMMIT
"""


def test_the_cleanup_removes_kube_proxys_rules_and_nothing_else():
    assert cleanup_input(SAVED).splitlines() == [
        "*filter", ":KUBE-SERVICES - [0:0]",
        '-D INPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        "-X KUBE-SERVICES", "COMMIT",
        "*nat", ":KUBE-SERVICES - [0:0]", ":KUBE-SVC-X - [0:0]",
        '-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        "-X KUBE-SERVICES", "-X KUBE-SVC-X", "COMMIT"]
    assert cleanup_input("*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n") == ""
