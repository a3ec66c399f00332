"""kube-proxy's rulesets for a node loaded into the kernel's iptables and
nftables (what they hold: tests/lab/test_kube_proxy.py)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from bench.scenario import Scenario
from kpng_py.model import IPFamily
from lab.kube_proxy import KubeServicePort
from lab.kube_proxy import iptables as ipt
from lab.kube_proxy import nftables as nft
from lab.kube_proxy.iptables import IptablesProxier
from lab.kube_proxy.nftables import NftablesProxier
from lab.kube_proxy.node import KubeProxyRules
from lab.netns import netns
from tests.support.kernel import require_root_bpf
from tests.support.kube_proxy import CLUSTER_CIDR, SVC1, V6


def _load(ns, command: tuple[str, ...], text: str) -> subprocess.CompletedProcess:
    return subprocess.run(ns.exec_args(*command), input=text, capture_output=True, text=True)


@pytest.mark.kernel
def test_nft_accepts_full_and_partial_syncs():
    require_root_bpf()
    if shutil.which("nft") is None:
        pytest.skip("needs nft (hack/setup.sh installs nftables)")
    scenario = Scenario(50, 4)
    before, after = scenario.endpoint_moves()
    proxier = NftablesProxier(CLUSTER_CIDR, "10.96.0.0/16")
    with netns("kpbn") as ns:
        checked = _load(ns, ("nft", "-c", "-f", "-"), proxier.full_sync(scenario.service_ports()))
        assert checked.returncode == 0, checked.stderr
        loaded = _load(ns, nft.LOAD_COMMAND, proxier.full_sync(scenario.service_ports()))
        assert loaded.returncode == 0, loaded.stderr
        partial = _load(ns, ("nft", "-c", "-f", "-"), proxier.partial_sync([(before, after)]))
        assert partial.returncode == 0, partial.stderr
        listed = ns.run("nft", "list", "map", "ip", "kube-proxy", "service-ips").stdout
        assert listed.count(" : goto service-") == 50


@pytest.mark.kernel
@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_iptables_restore_accepts_full_and_partial_syncs(variant: str):
    require_root_bpf()
    command = ipt.restore_command(variant)
    if shutil.which(command[0]) is None:
        pytest.skip(f"needs {command[0]} (hack/setup.sh installs iptables)")
    scenario = Scenario(50, 4)
    ports = scenario.service_ports()
    before, after = scenario.endpoint_moves()
    proxier = IptablesProxier(CLUSTER_CIDR)
    with netns("kpbi") as ns:
        for text in (proxier.jump_rules(), proxier.full_sync(ports)):
            done = _load(ns, command, text)
            assert done.returncode == 0, done.stderr
        ports[scenario.changed_index()] = after
        done = _load(ns, command, proxier.partial_sync(ports, [(before, after)]))
        assert done.returncode == 0, done.stderr
        saved = ns.run(f"iptables-{variant}-save", "-t", "nat").stdout
        moved = KubeServicePort.of(after)
        assert moved is not None and f"--to-destination {moved.endpoints[-1]}" in saved
        assert len(re.findall(r"^-A KUBE-SERVICES .* -j KUBE-SVC-", saved, re.M)) == 50


@pytest.mark.kernel
@pytest.mark.parametrize("family", [IPFamily.V4, IPFamily.V6])
def test_kube_proxy_on_a_node_syncs_and_cleans_up(family: IPFamily):
    require_root_bpf()
    port = SVC1 if family is IPFamily.V4 else V6
    cidr = CLUSTER_CIDR if family is IPFamily.V4 else "fd00:10:244::/56"
    with netns("kpbk") as ns:
        rules = KubeProxyRules(ns.name, {family: cidr})
        rules.sync([port])
        rules.sync([port])  # a second sync: the jumps are not doubled
        saved = ns.run(f"{ipt.TOOL[family]}-nft-save").stdout
        assert saved.count("-A PREROUTING -m comment --comment \"kubernetes service portals\" "
                           "-j KUBE-SERVICES") == 1
        assert "-j DNAT --to-destination" in saved
        rules.cleanup()
        assert "KUBE-" not in ns.run(f"{ipt.TOOL[family]}-nft-save").stdout
