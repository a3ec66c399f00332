"""Which UDP conntrack entries go when a service port changes (N17): the
flows a change set leaves stale, the entries each of them matches, and the
cleaner that deletes them (on a fake of pyroute2's Conntrack: no kernel)."""

from __future__ import annotations

import dataclasses
import errno
import logging
import socket
from dataclasses import dataclass
from typing import Iterator

import pytest
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

from backends.ebpf.netfilter import conntrack
from backends.ebpf.netfilter.conntrack import ConntrackCleaner, StaleFlows, stale_udp_flows
from kpng_py.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from kpng_py.runtime.logs import record_fields
from tests.support.netfilter import ep, ip, web


def udp(*endpoints: Endpoint) -> ServicePort:
    return dataclasses.replace(web(*endpoints, external_ips=(ip("192.0.2.7"),)),
                               name=ServicePortName("ns", "dns", "", Protocol.UDP))


def test_stale_udp_flows_are_those_of_endpoints_that_went_and_untranslated_ones_at_first() -> None:
    endpoint = (ip("10.244.0.2"), 8080)
    frontends = frozenset({(ip("192.0.2.7"), 80)})
    assert stale_udp_flows(udp(ep(2), ep(3)), udp(ep(3))) == [
        StaleFlows(IPFamily.V4, endpoint, 30080, frontends)]
    assert stale_udp_flows(udp(ep(2)), None) == [
        StaleFlows(IPFamily.V4, endpoint, 30080, frontends)]
    assert stale_udp_flows(None, udp(ep(2))) == stale_udp_flows(udp(), udp(ep(2))) == [
        StaleFlows(IPFamily.V4, None, 30080, frontends)]
    assert stale_udp_flows(udp(ep(2)), udp(ep(2), ep(3))) == []
    assert stale_udp_flows(web(ep(2)), None) == []  # TCP has no such flows


# -- which entries a StaleFlows matches ---------------------------------------

CLIENT = "198.51.100.9"
GONE = StaleFlows(IPFamily.V4, (ip("10.244.0.2"), 8080), 30080,
                  frozenset({(ip("192.0.2.7"), 80)}))
UNTRANSLATED = dataclasses.replace(GONE, endpoint=None)


def flow(destination: tuple[str, int], answered_by: tuple[str, int]
         ) -> tuple[NFCTAttrTuple, NFCTAttrTuple]:
    """A UDP conntrack entry's (original, reply) tuples: from CLIENT:40000
    to `destination`, answered by `answered_by`."""
    orig = NFCTAttrTuple(saddr=CLIENT, daddr=destination[0], proto=socket.IPPROTO_UDP,
                         sport=40000, dport=destination[1])
    reply = NFCTAttrTuple(saddr=answered_by[0], daddr=CLIENT, proto=socket.IPPROTO_UDP,
                          sport=answered_by[1], dport=40000)
    return orig, reply


def test_a_flow_the_gone_endpoint_answered_matches_on_the_node_port_or_a_frontend() -> None:
    assert GONE.matches(*flow(("10.0.0.5", 30080), ("10.244.0.2", 8080)))  # any node address
    assert GONE.matches(*flow(("192.0.2.7", 80), ("10.244.0.2", 8080)))  # its ExternalIP
    assert not GONE.matches(*flow(("192.0.2.7", 81), ("10.244.0.2", 8080)))  # another port
    assert not GONE.matches(*flow(("10.0.0.5", 30080), ("10.244.0.3", 8080)))  # an endpoint kept
    assert not GONE.matches(*flow(("10.0.0.5", 30080), ("10.244.0.2", 9090)))


def test_flows_without_an_endpoint_match_only_when_they_were_not_translated() -> None:
    untranslated = flow(("10.0.0.5", 30080), ("10.0.0.5", 30080))
    assert UNTRANSLATED.matches(*untranslated)
    assert not GONE.matches(*untranslated)
    assert not UNTRANSLATED.matches(*flow(("10.0.0.5", 30080), ("10.244.0.2", 8080)))
    assert not UNTRANSLATED.matches(*flow(("10.0.0.5", 53), ("10.0.0.5", 53)))


# -- the cleaner, on a fake of pyroute2's Conntrack ---------------------------

@dataclass(frozen=True)
class Entry:
    tuple_orig: NFCTAttrTuple
    tuple_reply: NFCTAttrTuple


class FakeConntrack:
    """The part of pyroute2's Conntrack the cleaner uses: `dump_entries`
    over `entries`, and `entry("del")`, which fails with `delete_error`."""

    def __init__(self, entries: list[Entry], delete_error: int = 0) -> None:
        self.entries = entries
        self.delete_error = delete_error
        self.deleted: list[NFCTAttrTuple] = []

    def __call__(self, nfgen_family: int) -> FakeConntrack:
        assert nfgen_family == socket.AF_INET
        return self

    def __enter__(self) -> FakeConntrack:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def dump_entries(self, tuple_orig: NFCTAttrTuple) -> Iterator[Entry]:
        assert tuple_orig.proto == socket.IPPROTO_UDP
        return iter(self.entries)

    def entry(self, command: str, tuple_orig: NFCTAttrTuple) -> None:
        assert command == "del"
        if self.delete_error:
            raise NetlinkError(self.delete_error)
        self.deleted.append(tuple_orig)


class Counted:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


def test_the_cleaner_deletes_the_matching_entries_only(monkeypatch: pytest.MonkeyPatch) -> None:
    stale, live = Entry(*flow(("10.0.0.5", 30080), ("10.244.0.2", 8080))), Entry(
        *flow(("10.0.0.5", 30080), ("10.244.0.3", 8080)))
    fake = FakeConntrack([stale, live])
    monkeypatch.setattr(conntrack, "Conntrack", fake)
    failures = Counted()
    assert ConntrackCleaner(failures).delete([GONE]) == 1
    assert fake.deleted == [stale.tuple_orig] and failures.value == 0


def test_an_entry_that_expired_meanwhile_is_no_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conntrack, "Conntrack", FakeConntrack(
        [Entry(*flow(("10.0.0.5", 30080), ("10.244.0.2", 8080)))], delete_error=errno.ENOENT))
    failures = Counted()
    assert ConntrackCleaner(failures).delete([GONE]) == 0
    assert failures.value == 0


def test_a_netlink_failure_is_counted_and_logged_not_raised(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(conntrack, "Conntrack", FakeConntrack(
        [Entry(*flow(("10.0.0.5", 30080), ("10.244.0.2", 8080)))], delete_error=errno.EPERM))
    failures = Counted()
    with caplog.at_level(logging.WARNING, logger=conntrack.__name__):
        assert ConntrackCleaner(failures).delete([GONE, UNTRANSLATED]) == 0
    assert failures.value == 1  # once per family, not per flow
    (record,) = caplog.records
    logged = record_fields(record)
    assert (logged["family"], logged["endpoints"]) == ("ipv4", 2)
    assert isinstance(logged["error"], NetlinkError)
