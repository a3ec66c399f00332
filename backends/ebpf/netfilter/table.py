"""kpng-py's own nftables table for packets from outside the node: node
ports, ExternalIPs and LoadBalancer IPs DNATed to endpoints, with the kernel's
conntrack reversing the translation (docs/ebpf.md, "Packets from outside the
node").

`NetfilterTable` programs the table of the network namespace it runs in
through libnftables' JSON API (Debian's python3-nftables): one transaction per
change set with only what changed; a full change set (the first one, or a
recovery) replaces the whole table in one transaction, so a restarted
process adopts the table it finds without a gap (N18).
"""

from __future__ import annotations

import json
import logging
from collections import ChainMap
from typing import Any, Iterable, Mapping

import nftables

from backends.ebpf.netfilter import expr as nx
from backends.ebpf.netfilter.conntrack import ConntrackCleaner, Failures, stale_udp_flows
from backends.ebpf.netfilter.plan import (
    FAMILIES,
    NODEPORT_IPS,
    TABLE,
    TABLE_FAMILY,
    NodePortMatch,
    PortObjects,
    per_family,
    port_objects,
    skeleton,
)
from backends.ebpf.netfilter.txn import (
    Command,
    Transaction,
    full_table,
    set_elements,
    table_command,
)
from kpng_py.model import IPAddress, Protocol, ServicePort, ServicePortChanges, ServicePortName
from kpng_py.runtime.logs import fields
from kpng_py.state.skips import Skips

log = logging.getLogger(__name__)

# A programmed service port and what it has in the table.
Held = tuple[ServicePort, PortObjects]


class NetfilterError(Exception):
    """libnftables refused a transaction; the message has its error text."""


class Nft:
    """One libnftables context: JSON in, JSON out."""

    def __init__(self) -> None:
        self._nft = nftables.Nftables()
        self._nft.set_json_output(True)
        self._nft.set_handle_output(False)

    def run(self, commands: list[Command], what: str) -> list[dict[str, Any]]:
        """Run `commands` (JSON text each) as one transaction; their JSON output."""
        rc, output, error = self._nft.cmd(f'{{"nftables": [{", ".join(commands)}]}}')
        if rc != 0:
            raise NetfilterError(f"nftables refused {what} ({len(commands)} commands) on table "
                                 f"{TABLE_FAMILY} {TABLE}: {error.strip()}")
        return json.loads(output)["nftables"] if output else []

    def table_exists(self) -> bool:
        rc, output, _ = self._nft.json_cmd({"nftables": [{"list": {"tables": {}}}]})
        if rc != 0:
            return False
        return any(obj.get("table", {}).get("name") == TABLE
                   and obj["table"].get("family") == TABLE_FAMILY
                   for obj in output["nftables"])


class NetfilterTable:
    """The table of the process's network namespace. `apply` must first get
    a full change set (as a Backend does); later ones carry only changes."""

    def __init__(self, addresses: NodePortMatch, skips: Skips,
                 conntrack_failures: Failures, nft: Nft | None = None) -> None:
        self._addresses = addresses
        self._node_ips = addresses.ips or frozenset()
        self._skips = skips
        self._nft = nft or Nft()
        self._cleaner = ConntrackCleaner(conntrack_failures)
        self._programmed: dict[ServicePortName, Held] = {}
        self._synced = False
        self.stale_udp_deleted = 0  # conntrack entries deleted so far

    def adopt(self) -> bool:
        """Whether a table from an earlier process is there. It keeps serving
        until the first full change set replaces it in one transaction."""
        found = self._nft.table_exists()
        log.info("netfilter table %s", "adopted" if found else "not found, made with the first "
                 "sync", extra=fields(table=f"{TABLE_FAMILY} {TABLE}"))
        return found

    def apply(self, changes: ServicePortChanges) -> None:
        # An incremental change set touches a few ports of many: it plans
        # `updates` (None: removed) over a view of what is programmed, and
        # commits them once nft took the transaction, never copying the rest.
        new: Mapping[ServicePortName, Held | None]
        updates: dict[ServicePortName, Held | None] = {}
        if changes.full:
            txn, programmed = self._full(changes)
            new = programmed
        elif not self._synced:
            raise NetfilterError(f"table {TABLE_FAMILY} {TABLE}: the first change set must be a "
                                 "full one (the state model's first sync, or a recovery)")
        else:
            txn, updates = self._incremental(changes)
            new = _over(updates, self._programmed)
        if txn:
            self._nft.run(txn.commands(), "a change set")
        touched = {port.name for port in (*changes.current(), *changes.removed)}
        if changes.full:
            touched |= self._programmed.keys()
        stale = [flows for name in touched if name.protocol is Protocol.UDP
                 for flows in stale_udp_flows(_port_of(self._programmed.get(name)),
                                              _port_of(new.get(name)))]
        if changes.full:
            self._programmed = programmed
        for name, held in updates.items():
            if held is None:
                self._programmed.pop(name, None)
            else:
                self._programmed[name] = held
        self._synced = True
        if stale:
            self.stale_udp_deleted += self._cleaner.delete(stale)

    def _objects(self, port: ServicePort) -> PortObjects:
        """What `port` gets in the table. Its frontends are its own: the state
        model gives each node port, ExternalIP and LB IP to one service port
        (nftables would refuse a map key twice)."""
        return port_objects(port, lambda text: self._skips.bad_source_range(str(port.name), text))

    def _full(self, changes: ServicePortChanges
              ) -> tuple[Transaction, dict[ServicePortName, Held]]:
        programmed = {port.name: (port, self._objects(port)) for port in changes.added}
        return self._whole_table(programmed), programmed

    def _whole_table(self, programmed: Mapping[ServicePortName, Held]) -> Transaction:
        """The transaction that makes the table hold exactly `programmed`."""
        maps, sets, chains = skeleton(self._addresses)
        txn = full_table(maps, sets, chains, [objects for _, objects in programmed.values()])
        txn.first += self._address_commands("add", self._node_ips)
        return txn

    @property
    def name(self) -> str:
        return f"{TABLE_FAMILY} {TABLE}"

    def gone(self) -> bool:
        """Whether the table this process programmed is no longer there
        (another process removed it)."""
        return self._synced and not self._nft.table_exists()

    def restore(self) -> None:
        """Make the table again, whole, from what this process programmed."""
        self._nft.run(self._whole_table(self._programmed).commands(), "the table put back")

    def _incremental(self, changes: ServicePortChanges
                     ) -> tuple[Transaction, dict[ServicePortName, Held | None]]:
        updates: dict[ServicePortName, Held | None] = {}
        view = _over(updates, self._programmed)
        txn = Transaction()
        for port in changes.removed:
            old = view.get(port.name)
            if old is not None:
                txn.change(old[1], PortObjects())
                updates[port.name] = None
        for port in changes.current():
            objects = self._objects(port)
            old = view.get(port.name)
            txn.change(old[1] if old else PortObjects(), objects)
            updates[port.name] = (port, objects)
        return txn, updates

    @property
    def follows_addresses(self) -> bool:
        """Whether the table answers on a list of node addresses (made with
        `NodePortMatch.only`), which `set_node_addresses` keeps current."""
        return self._addresses.ips is not None

    def set_node_addresses(self, ips: Iterable[IPAddress]) -> None:
        """The node addresses node ports answer on now (only for a table made
        with `NodePortMatch.only`): one transaction with the difference."""
        if self._addresses.ips is None:
            raise NetfilterError(f"table {TABLE_FAMILY} {TABLE} answers on every local address "
                                 "(fib daddr type local): it takes no address list; make it "
                                 "with NodePortMatch.only(...) to follow addresses")
        new = frozenset(ips)
        if self._synced:
            commands = [*self._address_commands("delete", self._node_ips - new),
                        *self._address_commands("add", new - self._node_ips)]
            if commands:
                self._nft.run(commands, "a node address change")
        self._node_ips = new

    def _address_commands(self, verb: str, ips: frozenset[IPAddress]) -> list[Command]:
        commands = []
        for family in FAMILIES:
            values = sorted(str(ip) for ip in ips if ip.version == family.value)
            if values:
                commands.append(set_elements(verb, per_family(NODEPORT_IPS, family), values))
        return commands

    def describe(self) -> list[dict[str, Any]]:
        return describe_table(self._nft)

    def describe_lines(self) -> list[str]:
        return describe_lines(self._nft)

    def cleanup(self) -> bool:
        """Remove the table; whether there was one."""
        self._programmed = {}
        self._synced = False
        return cleanup_table(self._nft)


def _over(updates: dict[ServicePortName, Held | None],
          programmed: dict[ServicePortName, Held]) -> ChainMap[ServicePortName, Held | None]:
    """`updates` (None: removed) over what is programmed, which is not copied."""
    # A ChainMap writes to its first map only; typeshed gives all its maps
    # one (mutable) type, which `programmed`, only read and holding no None,
    # does not have.
    return ChainMap(updates, programmed)  # type: ignore[arg-type]


def _port_of(held: Held | None) -> ServicePort | None:
    return held[0] if held else None


def describe_table(nft: Nft | None = None) -> list[dict[str, Any]]:
    """The table as libnftables lists it (JSON objects); [] without one."""
    nft = nft or Nft()
    if not nft.table_exists():
        return []
    listing = json.dumps({"list": {"table": {"family": TABLE_FAMILY, "name": TABLE}}})
    return [obj for obj in nft.run([listing], "a listing")
        if "metainfo" not in obj]


def describe_lines(nft: Nft | None = None) -> list[str]:
    """One line per map element of the table (`kpng-py ebpf dump`):
    `service-nodeports4: tcp . 30080 -> goto svc4-default/web/http/tcp`."""
    return [f"{obj['map']['name']}: {_text(key)} -> {_text(value)}"
            for obj in describe_table(nft) if "map" in obj
            for key, value in obj["map"].get("elem", [])]


def cleanup_table(nft: Nft | None = None) -> bool:
    """Remove kpng-py's table from the process's network namespace; whether
    there was one. A namespace without one is only read, never written."""
    nft = nft or Nft()
    if not nft.table_exists():
        return False
    # `add` first: the transaction cannot fail if the table went meanwhile.
    nft.run([table_command("add"), table_command("delete")], "the table's removal")
    return True


def _text(value: nx.Json) -> str:
    """A listed key or verdict as nft prints it: `a . b`, `goto chain`, `drop`."""
    if isinstance(value, dict) and "concat" in value:
        return " . ".join(_text(part) for part in value["concat"])
    if isinstance(value, dict) and len(value) == 1:
        (kind, target), = value.items()
        return f"{kind} {target['target']}" if isinstance(target, dict) else kind
    return str(value)
