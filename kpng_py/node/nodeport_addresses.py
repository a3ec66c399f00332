"""Which node addresses answer on node ports: kube-proxy's
`--nodeport-addresses`, applied to the node's local addresses as netlink
reports them, live.

The flag takes CIDRs (either family, comma separated) or `primary`; without
it every local address is allowed (kube-proxy's iptables mode), loopback
included: a client on the node dialling `127.0.0.1:nodePort` is translated
at its socket like any node address, while packets from outside the node
never reach a node port at 127.0.0.0/8 (no `route_localnet`). Link-local
addresses are never node-port addresses: without their interface they name
no one address of the node.

`primary` is each family's primary node address: the preferred source of
its default route, or else the first global address of the default route's
interface. (kube-proxy takes the Node object's addresses; localv1 does not
carry them.)

`LocalAddressFollower` keeps the set current from netlink address and route
events (pyroute2), on a thread of its own, in the network namespace of the
process. Addresses on interfaces it is told to ignore (the userspace
backend's own interface of service addresses) are not node addresses.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import select
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Union

from kpng_py.model import IPAddress
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

PRIMARY = "primary"
_RT_SCOPE_UNIVERSE = 0
_RT_TABLE_MAIN = 254


@dataclass(frozen=True)
class LocalAddressSet:
    """The node's addresses (link-local ones left out), and which of them
    are its primary ones."""

    addresses: frozenset[IPAddress]
    primary: frozenset[IPAddress] = frozenset()


def parse_cidrs(items: Iterable[str], alternatives: str = "") -> tuple[IPNetwork, ...]:
    """CIDRs of either family; a ValueError names the first that is not one
    (and what else would have been accepted)."""
    cidrs: list[IPNetwork] = []
    for item in items:
        try:
            cidrs.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not a CIDR (such as 10.0.0.0/8 or fd00::/64)"
                             f"{alternatives}") from None
    return tuple(cidrs)


@dataclass(frozen=True)
class NodePortAddresses:
    """`--nodeport-addresses`: CIDRs, or the primary addresses; neither
    means every local address."""

    cidrs: tuple[IPNetwork, ...] = ()
    primary: bool = False

    @classmethod
    def parse(cls, text: str) -> NodePortAddresses:
        """`""`, `primary`, or CIDRs such as `10.0.0.0/8,fd00::/64`; a
        ValueError names what is wrong."""
        items = [item.strip() for item in text.split(",") if item.strip()]
        if items == [PRIMARY]:
            return cls(primary=True)
        if PRIMARY in items:
            raise ValueError(f"{PRIMARY!r} cannot be combined with CIDRs (got {text!r})")
        return cls(cidrs=parse_cidrs(items, f" nor {PRIMARY!r}"))

    def allowed(self, local: LocalAddressSet) -> frozenset[IPAddress]:
        """The local addresses that answer on node ports."""
        if self.primary:
            return local.primary
        if not self.cidrs:
            return local.addresses
        return frozenset(ip for ip in local.addresses
                         if any(ip in cidr for cidr in self.cidrs if cidr.version == ip.version))

    def __str__(self) -> str:
        if self.primary:
            return PRIMARY
        return ",".join(str(cidr) for cidr in self.cidrs) or "all local addresses"


def _flag_value(text: str) -> NodePortAddresses:
    try:
        return NodePortAddresses.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_nodeport_addresses_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodeport-addresses", type=_flag_value, default=NodePortAddresses(),
        metavar="CIDRS|primary",
        help="node addresses that answer on node ports, as kube-proxy's flag: comma-separated "
             "CIDRs of either family, or 'primary' (each family's default-route source); "
             "default every local address, 127.0.0.1 included for clients on the node")


class LocalAddressFollower:
    """The node's `LocalAddressSet`, current: `start()` scans it, then each
    change is passed to `on_change` (on the follower's thread) as the new
    whole set, once per burst of netlink events that changed it."""

    def __init__(self, on_change: Callable[[LocalAddressSet], None],
                 ignore_interfaces: Iterable[str] = ()) -> None:
        self._on_change = on_change
        self._ignored = frozenset(ignore_interfaces)
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._current = LocalAddressSet(frozenset())

    def start(self) -> LocalAddressSet:
        """The set now; changes are followed from here on (the netlink
        socket is subscribed before this returns)."""
        self._current = self.scan()
        subscribed = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(subscribed,),
                                        name="node-addresses", daemon=True)
        self._thread.start()
        subscribed.wait()
        return self._current

    def stop(self) -> None:
        """Ends the thread (woken through a pipe)."""
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def scan(self) -> LocalAddressSet:
        """The set as netlink shows it now (a fresh socket: the event
        socket's reads belong to the follower's thread)."""
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            addresses: set[IPAddress] = set()
            universe: dict[int, list[IPAddress]] = {}  # per interface, in netlink's order
            for message in ipr.get_addr():
                if names.get(message["index"]) in self._ignored:
                    continue
                text = message.get_attr("IFA_LOCAL") or message.get_attr("IFA_ADDRESS")
                ip = ipaddress.ip_address(text.split("%")[0]) if text else None
                if ip is None or ip.is_link_local or ip.is_unspecified:
                    continue
                addresses.add(ip)
                if message["scope"] == _RT_SCOPE_UNIVERSE:
                    universe.setdefault(message["index"], []).append(ip)
            primary = {ip for family in (socket.AF_INET, socket.AF_INET6)
                       if (ip := _primary(ipr, family, universe)) is not None}
        return LocalAddressSet(frozenset(addresses), frozenset(primary))

    def _follow(self, subscribed: threading.Event) -> None:
        # pyroute2's socket is used by the thread that made it (its events
        # do not wake another thread's select).
        from pyroute2 import IPRoute
        from pyroute2.netlink.rtnl import (
            RTMGRP_IPV4_IFADDR,
            RTMGRP_IPV4_ROUTE,
            RTMGRP_IPV6_IFADDR,
            RTMGRP_IPV6_ROUTE,
        )

        try:
            with IPRoute() as events:
                events.bind(groups=RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
                            | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE)
                subscribed.set()
                self._rescan()  # what changed between the first scan and the subscription
                while self._wait_for(events):
                    self._rescan()
        except Exception as err:  # noqa: BLE001 - netlink trouble: say so, keep the last set
            log.error("following the node's addresses failed; node ports keep the addresses "
                      "seen last", extra=fields(error=str(err)))
        finally:
            subscribed.set()

    def _rescan(self) -> None:
        now = self.scan()
        if now != self._current:
            log.info("node addresses changed", extra=fields(
                added=sorted(map(str, now.addresses - self._current.addresses)),
                removed=sorted(map(str, self._current.addresses - now.addresses)),
                primary=sorted(map(str, now.primary))))
            self._current = now
            self._on_change(now)

    def _wait_for(self, events) -> bool:
        """Reads a burst of events (their content does not matter: the set
        is scanned again); False when stop() was called."""
        ready, _, _ = select.select([events.fileno(), self._wake_r], [], [])
        if self._wake_r in ready:
            return False
        events.get()
        return True


def _primary(ipr, family: int, universe: dict[int, list[IPAddress]]) -> IPAddress | None:
    """The family's default route's preferred source, or the first address
    of global scope on its interface."""
    for route in ipr.get_routes(family=family, table=_RT_TABLE_MAIN):
        if route["dst_len"] != 0:
            continue
        source = route.get_attr("RTA_PREFSRC")
        if source is not None:
            return ipaddress.ip_address(source)
        version = 4 if family == socket.AF_INET else 6
        candidates = [ip for ip in universe.get(route.get_attr("RTA_OIF"), ())
                      if ip.version == version]
        if candidates:
            return candidates[0]
    return None
