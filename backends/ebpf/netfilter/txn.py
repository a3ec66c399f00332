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
from typing import Iterable

from backends.ebpf.netfilter import expr as nx
from backends.ebpf.netfilter.plan import (
    TABLE,
    TABLE_FAMILY,
    Chain,
    Element,
    NamedSet,
    PortObjects,
    VerdictMap,
)

# One command of a transaction, as JSON text: rules are kept as JSON text
# (`Chain.rules`), so a transaction is written without parsing them again.
Command = str


def _at(**what: object) -> dict[str, object]:
    return {"family": TABLE_FAMILY, "table": TABLE, **what}


def _command(verb: str, kind: str, spec: dict[str, object]) -> Command:
    return json.dumps({verb: {kind: spec}})


def table_command(verb: str) -> Command:
    return _command(verb, "table", {"family": TABLE_FAMILY, "name": TABLE})


def _chain(verb: str, chain: Chain) -> Command:
    spec = _at(name=chain.name)
    if verb == "add" and chain.hook is not None:
        spec.update(type=chain.hook.type, hook=chain.hook.hook, prio=chain.hook.priority,
                    policy="accept")
    return _command(verb, "chain", spec)


def _rules(chain: Chain) -> list[Command]:
    head = (f'{{"add": {{"rule": {{"family": "{TABLE_FAMILY}", "table": "{TABLE}", '
            f'"chain": {json.dumps(chain.name)}, "expr": ')
    return [f"{head}{rule}}}}}}}" for rule in chain.rules]


def _set(verb: str, named: NamedSet) -> Command:
    spec = _at(name=named.name)
    if verb == "add":
        spec["type"] = nx.ADDR_TYPE[named.family]
        if named.timeout:
            spec.update(flags=["timeout"], timeout=named.timeout)
    return _command(verb, "set", spec)


def map_command(vmap: VerdictMap) -> Command:
    return _command("add", "map", _at(name=vmap.name, type=list(vmap.key_types), map="verdict"))


def _key(element: Element) -> nx.Json:
    return nx.concat(*element.key) if len(element.key) > 1 else element.key[0]


def _elements(verb: str, elements: Iterable[Element]) -> list[Command]:
    """One command per map: its elements to add (key and verdict) or delete (key)."""
    by_map: dict[str, list[nx.Json]] = {}
    for e in sorted(elements, key=_order):
        by_map.setdefault(e.map, []).append(
            _key(e) if verb == "delete" else [_key(e), nx.verdict(e.kind, e.target)])
    return [_command(verb, "element", _at(name=name, elem=elems))
            for name, elems in by_map.items()]


def set_elements(verb: str, name: str, values: list[str]) -> Command:
    """Add or delete plain members of a named set (node addresses)."""
    return _command(verb, "element", _at(name=name, elem=values))


@dataclass
class Transaction:
    """Commands collected per phase (module docstring), emitted in order."""

    first: list[Command] = field(default_factory=list)  # table replacement, skeleton
    add_objects: list[Command] = field(default_factory=list)
    fill: list[Command] = field(default_factory=list)
    drop_elements: list[Element] = field(default_factory=list)
    add_elements: list[Element] = field(default_factory=list)
    flush_gone: list[Command] = field(default_factory=list)
    delete_chains: list[Command] = field(default_factory=list)
    delete_sets: list[Command] = field(default_factory=list)

    def change(self, old: PortObjects, new: PortObjects) -> None:
        """The commands that turn `old` into `new`."""
        if not (old or new):
            return  # a port with nothing from outside (most of them)
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
        self.drop_elements += old.elements - new.elements
        self.add_elements += new.elements - old.elements
        for name, chain in old_chains.items():
            if name not in new_chains:
                self.flush_gone.append(_chain("flush", chain))
                self.delete_chains.append(_chain("delete", chain))
        self.delete_sets += [_set("delete", s) for name, s in old_sets.items()
                             if name not in new_sets]

    def commands(self) -> list[Command]:
        # Sets go last: the chains referring to them are flushed by then, and
        # deleting a chain never needs a set.
        return [*self.first, *self.add_objects, *self.fill,
                *_elements("delete", self.drop_elements), *_elements("add", self.add_elements),
                *self.flush_gone, *self.delete_chains, *self.delete_sets]

    def __bool__(self) -> bool:
        return bool(self.first or self.add_objects or self.fill or self.drop_elements
                    or self.add_elements or self.flush_gone or self.delete_chains
                    or self.delete_sets)


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
