"""ClusterIPs made local to the node: /32 and /128 addresses on a dedicated
dummy interface (kube-proxy's IPVS mode does the same with `kube-ipvs0`).
Kernels built without the dummy driver get a bridge with no ports instead,
which holds local addresses the same way and forwards nothing.

A ClusterIP is on the interface while some service port uses it, with or
without endpoints: packets to a service without endpoints must reach this
node and be refused here, never be routed on. Addresses on the interface
that no service uses (left by an earlier run, or added by hand) are removed
by the reconciliation of a full change set.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from typing import Iterable

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD

from kpng_py.backend import BackendSetupError
from kpng_py.logs import fields
from kpng_py.model import IPAddress

log = logging.getLogger(__name__)


class AddressSetupError(BackendSetupError):
    """The interface for ClusterIPs cannot be created or brought up."""


class ClusterIPAddresses:
    """The ClusterIPs on one dummy interface, kept in step with the services."""

    def __init__(self, interface: str) -> None:
        self.interface = interface
        self._ipr: IPRoute | None = None
        self._index = 0
        self.present: set[IPAddress] = set()

    def setup(self) -> None:
        """Create the interface if needed, bring it up, and read what it holds."""
        self._ipr = IPRoute()
        try:
            found = self._ipr.link_lookup(ifname=self.interface)
            if not found:
                self._create()
                found = self._ipr.link_lookup(ifname=self.interface)
            self._index = found[0]
            self._ipr.link("set", index=self._index, state="up")
        except NetlinkError as err:
            hint = (" (needs CAP_NET_ADMIN: run as root)" if err.code == errno.EPERM
                    else " (is the name taken by an interface that is not a dummy?)")
            raise AddressSetupError(
                f"cannot set up the ClusterIP interface {self.interface!r}: "
                f"{err.args[-1] if err.args else err}{hint}") from err
        held = (ipaddress.ip_address(a.get("IFA_ADDRESS"))
                for a in self._ipr.get_addr(index=self._index))
        self.present = {ip for ip in held if not ip.is_link_local}

    def _create(self) -> None:
        assert self._ipr is not None
        for kind in ("dummy", "bridge"):
            try:
                self._ipr.link("add", ifname=self.interface, kind=kind)
            except NetlinkError as err:
                if err.code == errno.EOPNOTSUPP:  # this kernel lacks the driver
                    continue
                raise
            log.info("created the ClusterIP interface", extra=fields(
                interface=self.interface, kind=kind))
            return
        raise NetlinkError(errno.EOPNOTSUPP, "the kernel supports neither dummy nor bridge links")

    def add(self, addresses: Iterable[IPAddress]) -> None:
        for address in addresses:
            if address not in self.present:
                self._change("add", address)
                self.present.add(address)

    def remove(self, addresses: Iterable[IPAddress]) -> None:
        for address in addresses:
            if address in self.present:
                self._change("del", address)
                self.present.discard(address)

    def retain_only(self, wanted: set[IPAddress]) -> None:
        """Remove every address not in `wanted` (a full reconciliation)."""
        stale = self.present - wanted
        if stale:
            log.info("removing stale ClusterIPs", extra=fields(
                interface=self.interface, count=len(stale)))
        self.remove(stale)

    def _change(self, command: str, address: IPAddress) -> None:
        assert self._ipr is not None, "setup() first"
        try:
            # NODAD: a ClusterIP is ours alone; without it an IPv6 address
            # stays tentative (unusable) for a second or more.
            self._ipr.addr(command, index=self._index, address=str(address),
                           prefixlen=address.max_prefixlen,
                           **({"flags": IFA_F_NODAD} if address.version == 6 else {}))
        except NetlinkError as err:
            # Already there (add) or already gone (del): the goal is reached.
            if err.code not in (errno.EEXIST, errno.EADDRNOTAVAIL, errno.ENOENT):
                raise

    def close(self) -> None:
        """Stop managing; the addresses stay so that, during a restart,
        clients are refused by this node rather than routed elsewhere."""
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
