"""The fast reader of plain values (kpng_py/brain/plainvalue.py): what it
reads is what the strict reader (reader.Value) reads from the same text, and
what the strict reader refuses it declines with `Unchecked`, for the strict
reader to name."""

from __future__ import annotations

from typing import Any

import pytest

from kpng_py.api import localv1
from kpng_py.brain.plainload import Unchecked, plain_document
from kpng_py.brain.plainvalue import PlainValue
from kpng_py.brain.reader import FieldChecks, read_document
from kpng_py.brain.statefile import StateFileError


def _no_port(blame: Any, port: int) -> None:
    if port == 0:
        blame.fail("no port")


def _unnamed_ip(blame: Any, ip: str) -> None:
    if not ip:
        blame.fail("an empty IP")


CHECKS: FieldChecks = {"localv1.PortMapping.Port": _no_port, "localv1.IPSet.V4": _unnamed_ip}


def _fast(text: str) -> localv1.Service:
    return PlainValue(plain_document(text)).message(localv1.Service, CHECKS)


def _strict(text: str) -> localv1.Service:
    return read_document(text, "doc.yaml").message(localv1.Service, CHECKS)


@pytest.mark.parametrize("text", [
    "name: web\nnamespace: default\ntype: ClusterIP\n",
    "ports: [{name: http, protocol: TCP, port: 80, targetport: 8080}, {protocol: 2, port: 53}]\n",
    "ips: {clusterips: {v4: [10.96.0.1], v6: ['fd00::1']}, headless: false}\n",
    "labels: {app: web, tier: front}\nannotations: ~\n",
    "sessionaffinity: {clientip: {timeoutseconds: 60}}\n",
    "sessionaffinity: {clientip: ~}\n",  # a null member: an empty message
    "sessionaffinity: ~\nname: ~\nports: ~\nmapip: ~\n",  # null: as if absent
    "ipfilters: [{targetips: {v4: [10.0.0.1]}, sourceranges: [10.0.0.0/8]}]\n",
    "externaltraffictolocal: true\nhealthchecknodeport: 30000\n",
    "",
])
def test_a_good_document_reads_as_the_strict_reader_reads_it(text: str) -> None:
    assert _fast(text) == _strict(text)


@pytest.mark.parametrize("text", [
    "nme: web\n",  # an unknown key
    "sessionaffinity: {clientipx: {}}\n",  # an unknown member of a oneof
    "sessionaffinity: [1]\n",
    "ports: [{protocol: ICMP, port: 80}]\n",  # not a name of the enum
    "ports: [{port: 3000000000}]\n",  # outside int32
    "ports: [{port: '80'}]\n",  # a string for a number
    "ports: [{port: 0}]\n",  # refused by a field check
    "ports: 5\n",  # a scalar for a list
    "ports: [5]\n",  # a scalar for a message
    "ips: {clusterips: {v4: ['']}}\n",  # a repeated string refused by its check
    "ips: {clusterips: {v4: 10.0.0.1}}\n",
    "labels: [a]\n",  # a list for a map
    "mapip: 1\n",  # a number for a bool
    "name: [web]\n",  # a list for a string
    "[1, 2]\n",  # the message is no mapping
])
def test_what_the_strict_reader_refuses_is_declined(text: str) -> None:
    with pytest.raises(StateFileError):
        _strict(text)
    with pytest.raises(Unchecked):
        _fast(text)


def test_a_number_for_a_string_is_declined_for_the_strict_reader_to_read_its_text() -> None:
    """A typed value does not tell its text (`0x1`, `+1`): only the strict
    reader, which has the node's text, reads it as a string."""
    with pytest.raises(Unchecked):
        _fast("name: 0x1\n")
    assert _strict("name: 0x1\n").Name == "0x1"


def test_a_mapping_gives_each_allowed_key_and_declines_another() -> None:
    members = PlainValue({"a": [1, 2]}).mapping(["a", "b"])
    assert [item.integer(0, 9) for item in members["a"].sequence()] == [1, 2]
    assert members["b"].is_null and members["b"].sequence() == []
    assert members["b"].string() == "" and members["b"].string_map() == {}
    with pytest.raises(Unchecked):
        PlainValue({"a": 1, "c": 2}).mapping(["a", "b"])
    with pytest.raises(Unchecked):
        PlainValue([1]).mapping(["a"])


@pytest.mark.parametrize("read", [
    lambda: PlainValue(10).integer(0, 9),
    lambda: PlainValue(True).integer(0, 9),  # a bool is no whole number here
    lambda: PlainValue("x").boolean(),
    lambda: PlainValue({1: "a"}).string_map(),  # a key that is not a string
    lambda: PlainValue("x").sequence(),
])
def test_a_scalar_of_the_wrong_kind_or_range_is_declined(read: Any) -> None:
    with pytest.raises(Unchecked):
        read()
