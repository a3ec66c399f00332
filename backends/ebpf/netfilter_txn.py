"""Commands of one nftables transaction (libnftables' JSON schema), built in
an order in which every reference is valid when the kernel checks it.

A change moves objects from `old` to `new` (`PortObjects`, or the skeleton).
Within one transaction, in this order:

1. add new sets, then new chains (empty);
2. fill new chains, and flush and refill chains whose rules changed;
3. delete map elements that went or changed, then add the new ones;
4. flush the chains that went, then delete them (after every flush: a
   service chain refers to its endpoint chains);
5. delete the sets that went (no rule refers to them any more).

The kernel applies the whole transaction or none of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from backends.ebpf import netfilter_expr as nx
from backends.ebpf.netfilter_plan import (TABLE, TABLE_FAMILY, Chain, Element, NamedSet,
                                          PortObjects, VerdictMap)


def _at(**what: object) -> dict[str, object]:
    return {"family": TABLE_FAMILY, "table": TABLE, **what}


def table_command(verb: str) -> nx.Json:
    return {verb: {"table": {"family": TABLE_FAMILY, "name": TABLE}}}


def _chain(verb: str, chain: Chain) -> nx.Json:
    spec = _at(name=chain.name)
    if verb == "add" and chain.hook is not None:
        spec.update(type=chain.hook.type, hook=chain.hook.hook, prio=chain.hook.priority,
                    policy="accept")
    return {verb: {"chain": spec}}


def _rules(chain: Chain) -> list[nx.Json]:
    return [{"add": {"rule": _at(chain=chain.name, expr=json.loads(rule))}}
            for rule in chain.rules]


def _set(verb: str, named: NamedSet) -> nx.Json:
    spec = _at(name=named.name)
    if verb == "add":
        spec["type"] = nx.ADDR_TYPE[named.family]
        if named.timeout:
            spec.update(flags=["timeout"], timeout=named.timeout)
    return {verb: {"set": spec}}


def map_command(vmap: VerdictMap) -> nx.Json:
    return {"add": {"map": _at(name=vmap.name, type=list(vmap.key_types), map="verdict")}}


def _key(element: Element) -> nx.Json:
    return nx.concat(*element.key) if len(element.key) > 1 else element.key[0]


def _element(verb: str, element: Element) -> nx.Json:
    if verb == "delete":
        return {"delete": {"element": _at(name=element.map, elem=[_key(element)])}}
    return {"add": {"element": _at(name=element.map, elem=[
        [_key(element), nx.verdict(element.kind, element.target)]])}}


def set_elements(verb: str, name: str, values: list[str]) -> nx.Json:
    """Add or delete plain members of a named set (node addresses)."""
    return {verb: {"element": _at(name=name, elem=values)}}


@dataclass
class Transaction:
    """Commands collected per phase (module docstring), emitted in order."""

    first: list[nx.Json] = field(default_factory=list)  # table replacement, skeleton
    add_objects: list[nx.Json] = field(default_factory=list)
    fill: list[nx.Json] = field(default_factory=list)
    drop_elements: list[nx.Json] = field(default_factory=list)
    add_elements: list[nx.Json] = field(default_factory=list)
    flush_gone: list[nx.Json] = field(default_factory=list)
    delete_gone: list[nx.Json] = field(default_factory=list)

    def change(self, old: PortObjects, new: PortObjects) -> None:
        """The commands that turn `old` into `new`."""
        old_chains = {c.name: c for c in old.chains}
        new_chains = {c.name: c for c in new.chains}
        old_sets = {s.name: s for s in old.sets}
        new_sets = {s.name: s for s in new.sets}
        self.add_objects += [_set("add", s) for name, s in new_sets.items()
                             if name not in old_sets]
        for name, chain in new_chains.items():
            before = old_chains.get(name)
            if before is None:
                self.add_objects.append(_chain("add", chain))
                self.fill += _rules(chain)
            elif before.rules != chain.rules:
                self.fill += [_chain("flush", chain), *_rules(chain)]
        self.drop_elements += [_element("delete", e) for e in sorted(
            old.elements - new.elements, key=_order)]
        self.add_elements += [_element("add", e) for e in sorted(
            new.elements - old.elements, key=_order)]
        for name, chain in old_chains.items():
            if name not in new_chains:
                self.flush_gone.append(_chain("flush", chain))
                self.delete_gone.append(_chain("delete", chain))
        self.delete_gone += [_set("delete", s) for name, s in old_sets.items()
                             if name not in new_sets]

    def commands(self) -> list[nx.Json]:
        # Sets go after chains in delete_gone: chains referring to them are
        # flushed by then, and deleting a chain never needs a set.
        return [*self.first, *self.add_objects, *self.fill, *self.drop_elements,
                *self.add_elements, *self.flush_gone,
                *sorted(self.delete_gone, key=lambda c: "set" in c["delete"])]

    def __bool__(self) -> bool:
        return bool(self.commands())


def _order(element: Element) -> tuple[str, str]:
    return (element.map, repr(element.key))


def full_table(maps: list[VerdictMap], sets: list[NamedSet], chains: list[Chain],
               ports: list[PortObjects]) -> Transaction:
    """Replace the whole table in one transaction: `add table` first, so that
    `delete table` cannot fail on a node without one, then everything anew."""
    txn = Transaction(first=[table_command("add"), table_command("delete"),
                             table_command("add"),
                             *[map_command(m) for m in maps],
                             *[_set("add", s) for s in sets],
                             *[_chain("add", c) for c in chains],
                             *[rule for c in chains for rule in _rules(c)]])
    for objects in ports:
        txn.change(PortObjects(), objects)
    return txn
