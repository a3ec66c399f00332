"""The fast reader (plain values from json or yaml-rs, kpng_py/brain/plainload.py)
and the strict one accept the same files and build the same state, in any
style (block or flow YAML, JSON); a bad file's error is the strict reader's,
with its line."""

from __future__ import annotations

import json
import random
import re

import pytest
import yaml

from kpng_py.brain.processes import ReadProcesses
from kpng_py.brain.statefile import StateFileError, StateReader, parse_state, read_strict
from tests.support.state_files import (
    DNS,
    NODES,
    UDP,
    W1,
    W2,
    endpoint,
    flow_sequences,
    port,
    service,
    state,
    web,
)

# Scalars YAML 1.1 reads in many ways: as strings, numbers of other bases,
# floats, timestamps, nulls, booleans, collections, aliases, tags, or not at all.
TRICKY_SCALARS = [
    "yes", "No", "on", "OFF", "True", "TRUE", "false", "null", "Null", "~", "''", '""',
    "'it''s'", "'a: b'", '"a: b"', '"\\t"', "'x", "010", "0", "-0", "+5", "-1", "0x1F",
    "0o17", "0b101", "1_000", "1:30", "1.5", ".inf", "-.inf", ".nan", "1e3", "2001-12-14",
    "65536", "70000", "4294967296", "fd00::", "fd00::1", "10.1.0.300", "10.1.0.01", "a b",
    "a  b", "a #b", "a#b", "[]", "{}", "[a, b]", "{a: 1}", "&x a", "*x", "!!str 5", "|",
    ">", "-", "- a", "a:", "a: b", "=", "<<", "http", "node-a", "ClusterIP", "z1", "8080",
    "é", "10.96.0.10", "203.0.113.0/24", "10.0.0.0/33", "0_10", "09", "+0x1", "1e5", "'\\u'",
    '"\\ud800"', '"\\x41"', "!x", "&a", "[1, 2,]", '{"a": 1}', "{a: 1, a: 2}", "\u0085",
]
# Tokens a JSON value may be replaced with: JSON, YAML beyond JSON, neither.
TRICKY_JSON = ['"yes"', "true", "null", "1.0", "1e3", "-0", "010", '"\\ud83d\\ude00"', '"\\/"',
               "[]", "{}", '{"a": 1, "a": 2}', "NaN", '"a\\tb"', "yes", "~", "8080", '"8080"',
               '"10.1.0.300"', '"fd00::1"', '"http"', "53", "null", "null", '"z1"', "1", "2"]
ROUNDS = 1000


class IndentedDumper(yaml.SafeDumper):
    """Block style with sequences indented under their key (`services:` then
    `  - service:`), as many hand-written files are; yaml.dump's default
    leaves them at the key's column."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _documents() -> list[str]:
    """Valid files covering every field: block style (yaml.dump's default,
    and with indented sequences), flow style inside (collections of scalars
    inline, as in docs/examples/state.yaml), flow style throughout (one flow
    mapping, or a flow sequence under each top-level key), JSON (indented
    and compact)."""
    full = service(
        "cart", ("10.96.0.20", "fd00:96::20"),
        [port("https", number=443, nodeport=30443, targetport=8443),
         port("dns", UDP, 53, targetportname="dns")],
        [endpoint("10.1.3.1", node="n1", pod="c1", overrides={"https": 9443},
                  conditions={"ready": True}, hints={"zones": ["z1", "z2"]}),
         endpoint("10.1.3.2", "fd00:1::2"),
         endpoint("10.1.3.3", conditions={}, namespace="x", servicename="y", hash=7)],
        namespace="shop", labels={"app": "cart", "tier": "1"}, annotations={"n": "yes"},
        ipfilters=[{"targetips": {"v4": ["10.96.0.20"]}, "sourceranges": ["10.0.0.0/8"]}],
        mapip=False, externaltraffictolocal=True, internaltraffictolocal=True,
        healthchecknodeport=32000, sessionaffinity={"clientip": {"timeoutseconds": 600}})
    documents = [state(web(W1, W2), DNS, full, nodes=NODES),
                 state(web(), nodes=[{"name": "n1", "labels": {"a": "b"}}]),
                 state()]
    return [text for d in documents for sort in (True, False) for text in (
        yaml.safe_dump(d, sort_keys=sort),
        yaml.safe_dump(d, sort_keys=sort, default_flow_style=None),
        yaml.safe_dump(d, sort_keys=sort, default_flow_style=True),
        yaml.dump(d, Dumper=IndentedDumper, sort_keys=sort),
        json.dumps(d, indent=2, sort_keys=sort), json.dumps(d, sort_keys=sort))
    ] + [flow_sequences(d) for d in documents]


def _mutations(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        if not lines:
            break
        at = rng.randrange(len(lines))
        line = lines[at]
        choice = rng.randrange(8)
        if choice == 0:
            del lines[at]
        elif choice == 1:
            lines.insert(at, line)
        elif choice == 2:
            lines[at] = " " * rng.choice((1, 2, 4)) + line
        elif choice == 3 and line.startswith(" "):
            lines[at] = line[rng.choice((1, 2)):]
        elif choice == 4:
            lines.insert(at, rng.choice(("", "# a comment", "  # indented comment", "---")))
        elif choice == 5 and ": " in line:
            key, _, _ = line.partition(": ")
            lines[at] = f"{key}: {rng.choice(TRICKY_SCALARS)}"
        elif choice == 6 and line.lstrip().startswith("- ") and ":" not in line:
            head, _, _ = line.partition("- ")
            lines[at] = f"{head}- {rng.choice(TRICKY_SCALARS)}"
        elif choice == 7 and line.rstrip().endswith(":"):
            lines[at] = f"{line} {rng.choice(TRICKY_SCALARS)}"
    return "\n".join(lines) + rng.choice(("\n", "", "\n\n"))


def _json_mutation(text: str, rng: random.Random) -> str:
    """One JSON scalar (a value after a key) replaced by a token that JSON,
    YAML or neither reads."""
    scalars = list(re.finditer(r'(?<=: )(?:"[^"]*"|[-\w.]+)', text))
    if not scalars:
        return text
    found = rng.choice(scalars)
    return f"{text[:found.start()]}{rng.choice(TRICKY_JSON)}{text[found.end():]}"


def read_fast(text: str) -> object:
    return StateReader("state.yaml").read_plain(text)


def _strict(text: str) -> object:
    try:
        return read_strict(text, "state.yaml")
    except StateFileError as err:
        return err


def test_generated_files_take_the_fast_path_and_read_the_same() -> None:
    for text in _documents():
        fast = read_fast(text)
        assert fast is not None, text
        assert fast == read_strict(text, "state.yaml")


@pytest.mark.parametrize("mutate", [_mutations, _json_mutation])
def test_mutated_files_read_the_same_by_both_readers(mutate) -> None:
    """Mutations of valid files, many of them invalid, or read otherwise by
    YAML 1.1 and YAML 1.2: whatever the fast path accepts, the strict reader
    accepts and reads the same."""
    rng = random.Random(14)
    documents = _documents()
    reader = StateReader("state.yaml")  # what it remembers of one version serves the next
    fast_read = strict_read = 0
    for round_ in range(ROUNDS):
        text = mutate(rng.choice(documents), rng)
        strict = _strict(text)
        strict_read += not isinstance(strict, StateFileError)
        fast = reader.read_plain(text)
        if fast is None:
            continue
        fast_read += 1
        assert fast == strict, (round_, text)
    # Both kinds of outcome happen often, or this test would test nothing.
    assert fast_read > ROUNDS // 6 and strict_read > fast_read * 0.9
    assert ROUNDS - strict_read > ROUNDS // 6


def test_services_as_column_0_items_and_in_place_are_not_read_fast() -> None:
    text = "services:\n  - service: {name: a}\n- service:\n    name: b\n"
    assert read_fast(text) is None
    assert isinstance(_strict(text), StateFileError)


# The styles of a generated file: block, flow inside, JSON, block with
# indented sequences, flow throughout (one flow mapping; a flow sequence a
# top-level key).
DUMPS = [yaml.safe_dump, lambda d: yaml.safe_dump(d, default_flow_style=None),
         lambda d: json.dumps(d, indent=2), lambda d: yaml.dump(d, Dumper=IndentedDumper),
         lambda d: yaml.safe_dump(d, default_flow_style=True), flow_sequences]


def _big_state(services: int) -> dict:
    return state(*[service(f"s{i}", (f"10.96.{i // 250}.{i % 250 + 1}",), [port("http")],
                           [endpoint(f"10.1.{i // 250}.{i % 250 + 1}", pod=f"p{i}")])
                   for i in range(services)])


@pytest.mark.parametrize("dump", DUMPS)
def test_a_bad_big_file_gets_the_strict_readers_error(dump) -> None:
    """A generated file with one bad address deep inside: the fast path finds
    the problem, the strict reader names its line."""
    text = dump(_big_state(200))
    assert read_fast(text) is not None
    bad = text.replace("10.1.0.151", "10.1.0.351")
    line = next(n for n, text in enumerate(bad.splitlines(), 1) if "10.1.0.351" in text)
    assert read_fast(bad) is None
    with pytest.raises(StateFileError) as caught:
        parse_state(bad.encode(), "state.yaml")
    assert str(caught.value) == (
        f"state.yaml:{line}: services[150].endpoints[0].endpoint.ips.v4[0]: '10.1.0.351' is "
        "not an IP address")
    assert str(caught.value) == str(_strict(bad))


@pytest.mark.parametrize("dump", DUMPS)
def test_an_edit_reads_only_the_services_edited(dump) -> None:
    """Services written as items (block style, flow style inside or
    throughout, indented JSON: items.py) are read item by item: an
    unchanged item is not read again."""
    reader = StateReader("state.yaml")
    text = dump(_big_state(50))
    before = reader.read(text.encode())
    edited = reader.read(text.replace("10.1.0.31", "10.9.9.9").encode())
    assert [a is b for a, b in zip(before.services, edited.services)].count(False) == 1
    assert edited == parse_state(text.replace("10.1.0.31", "10.9.9.9").encode(), "state.yaml")


# Two processes for the items of any file of 20 services or more (processes.py).
TWO_PROCESSES = ReadProcesses(2, min_share=10)


@pytest.mark.parametrize("dump", DUMPS)
def test_two_processes_read_the_state_one_reads(dump) -> None:
    text = dump(_big_state(50))
    one = StateReader("state.yaml", ReadProcesses(1)).read(text.encode())
    assert StateReader("state.yaml", TWO_PROCESSES).read(text.encode()) == one


@pytest.mark.parametrize("dump", DUMPS)
def test_a_problem_in_the_second_processs_share_gets_the_strict_readers_error(dump) -> None:
    bad = dump(_big_state(50)).replace("10.1.0.41", "10.1.0.341")  # services[40]
    reader = StateReader("state.yaml", TWO_PROCESSES)
    assert reader.read_plain(bad) is None
    with pytest.raises(StateFileError, match=r"services\[40\]\.endpoints\[0\]"):
        reader.read(bad.encode())
