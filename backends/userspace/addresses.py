"""ClusterIPs made local to the node: /32 and /128 addresses on a dedicated
dummy interface (kube-proxy's IPVS mode does the same with `kube-ipvs0`).
Kernels built without the dummy driver get a bridge with no ports instead,
which holds local addresses the same way and forwards nothing.

The backend manages only an interface that is its own: one it created, which
it marks with an alias (`MARKER`), or an existing one of a kind it would
create that carries the marker. Anything else (the loopback interface, an
uplink, a bridge with ports, an unmarked link) is refused at setup, untouched.
See `check_ownership` for the one exception, an earlier version's interface.

A ClusterIP is on the interface while some service port uses it, with or
without endpoints: packets to a service without endpoints must reach this
node and be refused here, never be routed on. Host addresses (/32, /128, not
link-local) on the interface that no service uses (left by an earlier run, or
added by hand) are removed by the reconciliation of a full change set; other
addresses on it are never touched.

One address the kernel refuses is logged once, counted and left out (its
services are not served on it); it is tried again with every later change
set. Failures of the interface itself (gone, no privilege, netlink socket
broken) raise: the whole change set fails, and the next apply starts over by
setting the interface up again.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD

from backends.userspace.context import DEFAULT_INTERFACE, MARKER, ProxyStats
from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.model import IPAddress
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

# What the backend creates, in order of preference.
OWN_KINDS = ("dummy", "bridge")
_IFF_LOOPBACK = 0x8
# Netlink errors about the interface or this process rather than one address.
_INTERFACE_ERRORS = frozenset({errno.ENODEV, errno.EPERM})
# Netlink errors that mean the change is already in place.
_ALREADY_DONE = {"add": frozenset({errno.EEXIST}),
                 "del": frozenset({errno.EADDRNOTAVAIL, errno.ENOENT})}


class AddressSetupError(BackendSetupError):
    """The interface for ClusterIPs cannot be created, used or brought up."""


@dataclass(frozen=True)
class InterfaceAddress:
    ip: IPAddress
    prefixlen: int

    @property
    def is_cluster_ip_like(self) -> bool:
        """A host address (/32, /128) that is not link-local: what a ClusterIP is,
        and the only kind of address the backend ever removes."""
        return self.prefixlen == self.ip.max_prefixlen and not self.ip.is_link_local

    def __str__(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


@dataclass(frozen=True)
class Link:
    """What decides whether an existing interface may be managed."""

    name: str
    index: int
    kind: str | None
    alias: str | None
    loopback: bool
    ports: int
    addresses: tuple[InterfaceAddress, ...]


def check_ownership(link: Link) -> bool:
    """Whether `link` may hold the ClusterIPs; True if it must be marked first.

    An unmarked interface is adopted only as an earlier version left it: named
    like the default, of a kind the backend creates and holding nothing but
    host and link-local addresses. Earlier versions created it unmarked on
    every node, and refusing it would stop every upgraded node's proxy until
    someone ran a command there; an interface by that name, of that kind and
    holding only ClusterIP-like addresses is, in practice, such a leftover.
    Under any other name an unmarked interface is refused.
    """
    if link.loopback:
        raise _refusal(link, "it is the loopback interface, which kpng-py never manages",
                       can_mark=False)
    if link.kind not in OWN_KINDS:
        what = f"a {link.kind} link" if link.kind else "a physical link"
        raise _refusal(link, f"it is {what}, not a dummy or bridge that kpng-py would "
                             "create", can_mark=False)
    if link.kind == "bridge" and link.ports:
        raise _refusal(link, f"it is a bridge with {link.ports} port(s)", can_mark=False)
    if link.alias == MARKER:
        return False
    others = [str(a) for a in link.addresses
              if not (a.is_cluster_ip_like or a.ip.is_link_local)]
    if link.name == DEFAULT_INTERFACE and not others:
        return True
    held = f" and holds {', '.join(others)}" if others else ""
    raise _refusal(link, f"it is not marked as kpng-py's (alias {MARKER!r}){held}",
                   can_mark=True)


def _refusal(link: Link, why: str, can_mark: bool) -> AddressSetupError:
    fix = "pick another name with --interface (kpng-py creates it if missing)"
    if can_mark:
        fix += (f", or, if it really is meant for kpng-py, mark it with `ip link set dev "
                f"{link.name} alias '{MARKER}'` (kpng-py then removes every /32 and /128 "
                "address on it that no service uses)")
    return AddressSetupError(
        f"refusing to manage the interface {link.name!r} for ClusterIPs: {why}; {fix}")


def _interface_address(message) -> InterfaceAddress:
    # IFA_LOCAL is the address itself; IFA_ADDRESS is the peer on a
    # point-to-point IPv4 link (IPv6 sends only IFA_ADDRESS).
    text = message.get("IFA_LOCAL") or message.get("IFA_ADDRESS")
    return InterfaceAddress(ipaddress.ip_address(text), message["prefixlen"])


def _read_link(ipr: IPRoute, index: int) -> Link:
    message = ipr.get_links(index)[0]
    kind = message.get(("IFLA_LINKINFO", "IFLA_INFO_KIND"))
    ports = sum(1 for other in ipr.get_links()
                if other.get("IFLA_MASTER") == index) if kind == "bridge" else 0
    return Link(name=message.get("IFLA_IFNAME"), index=index, kind=kind,
                alias=message.get("IFLA_IFALIAS"),
                loopback=bool(message["flags"] & _IFF_LOOPBACK), ports=ports,
                addresses=tuple(_interface_address(a) for a in ipr.get_addr(index=index)))


class ClusterIPAddresses:
    """The ClusterIPs on the backend's own interface, kept in step with the
    services."""

    def __init__(self, interface: str, stats: ProxyStats) -> None:
        self.interface = interface
        self._stats = stats
        self._ipr: IPRoute | None = None
        self._index = 0
        # Managed addresses on the interface, and wanted ones the kernel
        # refused (with the error last logged for each).
        self.present: set[IPAddress] = set()
        self._failed: dict[IPAddress, str] = {}
        self._broken = False

    @property
    def failed(self) -> frozenset[IPAddress]:
        return frozenset(self._failed)

    def holds(self, address: IPAddress) -> bool:
        return address in self.present

    def setup(self) -> None:
        """Create the interface if needed (or check that it is ours), bring it
        up, and read the ClusterIPs it holds."""
        ipr = self._ipr = IPRoute()
        try:
            link = self._own_link(ipr)
            self._index = link.index
            ipr.link("set", index=self._index, state="up")
        except NetlinkError as err:
            self.close()
            hint = " (needs CAP_NET_ADMIN: run as root)" if err.code == errno.EPERM else ""
            raise AddressSetupError(
                f"cannot set up the ClusterIP interface {self.interface!r}: "
                f"{err.args[-1] if err.args else err}{hint}") from err
        except BaseException:
            self.close()
            raise
        self.present = {a.ip for a in link.addresses if a.is_cluster_ip_like}
        self._broken = False

    def repair(self) -> None:
        """After a failure of the interface itself: set it up anew (a full
        change set then puts every ClusterIP back)."""
        if self._broken:
            log.warning("setting the ClusterIP interface up again after a failure",
                        extra=fields(interface=self.interface))
            self.close()
            self.setup()

    def _own_link(self, ipr: IPRoute) -> Link:
        found = ipr.link_lookup(ifname=self.interface)
        if not found:
            return self._create(ipr)
        link = _read_link(ipr, found[0])
        if check_ownership(link):
            ipr.link("set", index=link.index, ifalias=MARKER)
            log.warning("adopted an unmarked ClusterIP interface named like the default "
                        "(left by an earlier kpng-py) and marked it as kpng-py's",
                        extra=fields(interface=self.interface, kind=link.kind,
                                     alias=MARKER))
        return link

    def _create(self, ipr: IPRoute) -> Link:
        for kind in OWN_KINDS:
            try:
                ipr.link("add", ifname=self.interface, kind=kind)
            except NetlinkError as err:
                if err.code == errno.EOPNOTSUPP:  # this kernel lacks the driver
                    continue
                raise
            break
        else:
            raise NetlinkError(errno.EOPNOTSUPP,
                               "the kernel supports neither dummy nor bridge links")
        index = ipr.link_lookup(ifname=self.interface)[0]
        try:  # the kernel ignores an alias given at creation
            ipr.link("set", index=index, ifalias=MARKER)
        except BaseException:
            ipr.link("del", index=index)
            raise
        log.info("created the ClusterIP interface", extra=fields(
            interface=self.interface, kind=kind, alias=MARKER))
        return _read_link(ipr, index)

    def refresh(self) -> None:
        """Read the managed addresses again (a full reconciliation: someone
        may have removed some, or the kernel did, with IPv6 turned off)."""
        ipr = self._netlink()
        with self._interface_failures():
            held = [_interface_address(a) for a in ipr.get_addr(index=self._index)]
        self.present = {a.ip for a in held if a.is_cluster_ip_like}

    def add(self, addresses: Iterable[IPAddress]) -> None:
        """Add the missing ones; one the kernel refuses is left out (see failed)."""
        for address in addresses:
            if address in self.present:
                continue
            error = self._change("add", address)
            if error is None:
                self.present.add(address)
                if self._failed.pop(address, None) is not None:
                    log.info("added a ClusterIP that had failed before", extra=fields(
                        interface=self.interface, cluster_ip=str(address)))
            elif self._failed.get(address) != error:
                self._failed[address] = error
                self._stats.error("address")
                log.error("cannot add a ClusterIP to the interface; its services are not "
                          "served on it until a later change set adds it",
                          extra=fields(interface=self.interface, cluster_ip=str(address),
                                       error=error))

    def remove(self, addresses: Iterable[IPAddress]) -> None:
        for address in addresses:
            self._failed.pop(address, None)
            if address not in self.present:
                continue
            error = self._change("del", address)
            if error is None:
                self.present.discard(address)
            else:  # still there: the next full reconciliation tries again
                self._stats.error("address")
                log.error("cannot remove a ClusterIP from the interface", extra=fields(
                    interface=self.interface, cluster_ip=str(address), error=error))

    def retain_only(self, wanted: set[IPAddress]) -> None:
        """Remove every managed address not in `wanted` (a full reconciliation)."""
        stale = self.present - wanted
        if stale:
            log.info("removing stale ClusterIPs", extra=fields(
                interface=self.interface, count=len(stale)))
        self.remove(stale | (self.failed - wanted))

    def _change(self, command: str, address: IPAddress) -> str | None:
        """Add or delete one address; the kernel's reason if it refused it."""
        ipr = self._netlink()
        # NODAD: a ClusterIP is ours alone; without it an IPv6 address
        # stays tentative (unusable) for a second or more.
        flags = {"flags": IFA_F_NODAD} if address.version == 6 else {}
        with self._interface_failures():
            try:
                ipr.addr(command, index=self._index, address=str(address),
                               prefixlen=address.max_prefixlen, **flags)
            except NetlinkError as err:
                if err.code in _ALREADY_DONE[command]:
                    return None
                if err.code in _INTERFACE_ERRORS:
                    raise
                return err.args[-1] if err.args else str(err)
        return None

    def _netlink(self) -> IPRoute:
        """The netlink socket `setup` opened."""
        if self._ipr is None:
            raise RuntimeError(f"the ClusterIP interface {self.interface!r} is not set up: "
                               "call setup() before changing its addresses (and again "
                               "after close())")
        return self._ipr

    @contextmanager
    def _interface_failures(self) -> Iterator[None]:
        """What escapes is a failure of the interface: `repair` sets it up anew."""
        try:
            yield
        except BaseException:
            self._broken = True
            raise

    def close(self) -> None:
        """Stop managing; the addresses stay so that, during a restart,
        clients are refused by this node rather than routed elsewhere."""
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
