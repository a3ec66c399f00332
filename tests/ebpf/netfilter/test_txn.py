"""The commands of a netfilter transaction, and their order: every object a
command refers to exists when the kernel checks it (pure: no kernel)."""

from __future__ import annotations

import json
from typing import Sequence

from backends.ebpf.netfilter.plan import NodePortMatch, skeleton
from backends.ebpf.netfilter.txn import Transaction, full_table
from tests.support.netfilter import SVC, change, ep, ip, objects, web


def summary(commands: Sequence[dict | str]) -> list[tuple[str, str, str]]:
    """(verb, kind, name) of each command; a rule's name is its chain."""
    out = []
    for command in commands:
        if isinstance(command, str):
            command = json.loads(command)
        (verb, body), = command.items()
        (kind, spec), = body.items()
        out.append((verb, kind, spec.get("name") or spec.get("chain", "")))
    return out


def test_an_unchanged_port_makes_an_empty_transaction() -> None:
    port = web(ep(2))
    assert change(port, port) == []
    assert not Transaction()


def test_a_new_endpoint_adds_its_chain_and_refills_the_service_chain_only() -> None:
    commands = summary(change(web(ep(2)), web(ep(2), ep(3))))
    new_chain = "ep4-ns/web/http/tcp/10.244.0.3/8080"
    # The new chain exists (empty) before the service chain refers to it; no
    # map element changes: the frontends still go to the same service chain.
    assert commands == [
        ("add", "chain", new_chain),
        ("flush", "chain", SVC), ("add", "rule", SVC), ("add", "rule", SVC),
        ("add", "rule", new_chain), ("add", "rule", new_chain),
    ]


def test_a_removed_port_deletes_elements_then_flushes_then_deletes_chains() -> None:
    commands = summary(change(web(ep(2)), None))
    verbs = [(verb, kind) for verb, kind, _ in commands]
    assert verbs == [("delete", "element"), ("flush", "chain"), ("flush", "chain"),
                     ("delete", "chain"), ("delete", "chain")]
    assert {name for _, kind, name in commands if kind == "chain"} == {
        SVC, "ep4-ns/web/http/tcp/10.244.0.2/8080"}


def test_a_changed_affinity_timeout_is_a_new_set_and_the_old_one_goes_last() -> None:
    commands = summary(change(web(ep(2), affinity_timeout_seconds=10),
                              web(ep(2), affinity_timeout_seconds=20)))
    old_set = "aff4-10s-ns/web/http/tcp/10.244.0.2/8080"
    new_set = "aff4-20s-ns/web/http/tcp/10.244.0.2/8080"
    assert commands[0] == ("add", "set", new_set)
    assert commands[-1] == ("delete", "set", old_set)


def test_the_full_table_replaces_the_old_one_in_the_same_transaction() -> None:
    maps, sets, chains = skeleton(NodePortMatch.only([ip("192.0.2.1")]))
    commands = summary(full_table(maps, sets, chains, [objects(web(ep(2)))]).commands())
    assert commands[:3] == [("add", "table", "kpng-py"), ("delete", "table", "kpng-py"),
                            ("add", "table", "kpng-py")]
    assert ("add", "set", "nodeport-ips4") in commands
    assert ("add", "chain", SVC) in commands
    assert not any(verb in ("flush", "delete") for verb, _, _ in commands[3:])
