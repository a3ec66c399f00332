"""The fast reader (block-style YAML into plain values) and the strict one
accept the same files and build the same state; a bad file's error is the
strict reader's, with its line."""

from __future__ import annotations

import random

import pytest
import yaml

from kpng_py.brain.blockyaml import NotBlockStyle, load_block
from kpng_py.brain.statefile import StateFileError, StateReader, parse_state, read_strict
from tests.brain.helpers import DNS, NODES, UDP, W1, W2, endpoint, port, service, state, web

# Scalars YAML 1.1 reads in many ways: as strings, numbers of other bases,
# floats, timestamps, nulls, booleans, collections, aliases, tags, or not at all.
TRICKY_SCALARS = [
    "yes", "No", "on", "OFF", "True", "TRUE", "false", "null", "Null", "~", "''", '""',
    "'it''s'", "'a: b'", '"a: b"', '"\\t"', "'x", "010", "0", "-0", "+5", "-1", "0x1F",
    "0o17", "0b101", "1_000", "1:30", "1.5", ".inf", "-.inf", ".nan", "1e3", "2001-12-14",
    "65536", "70000", "4294967296", "fd00::", "fd00::1", "10.1.0.300", "10.1.0.01", "a b",
    "a  b", "a #b", "a#b", "[]", "{}", "[a, b]", "{a: 1}", "&x a", "*x", "!!str 5", "|",
    ">", "-", "- a", "a:", "a: b", "=", "<<", "http", "node-a", "ClusterIP", "z1", "8080",
    "é", "10.96.0.10", "203.0.113.0/24", "10.0.0.0/33",
]
ROUNDS = 1000


def _documents() -> list[str]:
    """Valid files in the style yaml.dump writes, covering every field."""
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
    return [yaml.safe_dump(d, sort_keys=sort) for d in documents for sort in (True, False)]


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


def read_fast(text: str) -> object:
    return StateReader("state.yaml").read_fast(text)


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
        assert load_block(text) == yaml.safe_load(text)


def test_mutated_files_read_the_same_by_both_readers() -> None:
    """Mutations of valid files, many of them invalid or beyond block style:
    whatever the fast path accepts, the strict reader accepts and reads the
    same, and the plain values are PyYAML's."""
    rng = random.Random(14)
    documents = _documents()
    reader = StateReader("state.yaml")  # what it remembers of one version serves the next
    fast_read = strict_read = 0
    for round_ in range(ROUNDS):
        text = _mutations(rng.choice(documents), rng)
        strict = _strict(text)
        strict_read += not isinstance(strict, StateFileError)
        fast = reader.read_fast(text)
        if fast is None:
            continue
        fast_read += 1
        assert fast == strict, (round_, text)
        assert load_block(text) == yaml.safe_load(text), (round_, text)
    # Both kinds of outcome happen often, or this test would test nothing.
    assert fast_read > ROUNDS // 6 and strict_read > fast_read * 0.9
    assert ROUNDS - strict_read > ROUNDS // 6


def test_services_as_column_0_items_and_in_place_are_not_read_fast() -> None:
    text = "services:\n  - service: {name: a}\n- service:\n    name: b\n"
    assert read_fast(text) is None
    assert isinstance(_strict(text), StateFileError)


@pytest.mark.parametrize("text", [
    "a: 1\n  b: 2\n", "a:\n- 1\n  - 2\n", "- a\n  b\n", "a: b\nc\n", "a: [1]\n", "a: 'b\n  c'\n",
    "a: 1\na: 2\n", "? a\n: b\n", "a: &x 1\nb: *x\n", "a:\n  b: 1\n c: 2\n", "- - a\n",
    "a: b # c\n", "a:\tb\n", "a: 1\r\n", "  a: 1\n", "a: |\n  x\n", "a: 010\n", "a: 1:30\n",
    "-\n- a\n", "a:\n  - b\n  c: d\n",
])
def test_the_block_reader_reads_as_pyyaml_or_declines(text: str) -> None:
    try:
        plain = load_block(text)
    except NotBlockStyle:
        return
    assert plain == yaml.safe_load(text)


def test_a_bad_big_file_gets_the_strict_readers_error() -> None:
    """A generated file with one bad address deep inside: the fast path finds
    the problem, the strict reader names its line."""
    services = [service(f"s{i}", (f"10.96.{i // 250}.{i % 250 + 1}",), [port("http")],
                        [endpoint(f"10.1.{i // 250}.{i % 250 + 1}", pod=f"p{i}")])
                for i in range(200)]
    text = yaml.safe_dump(state(*services))
    assert read_fast(text) is not None
    bad = text.replace("- 10.1.0.151\n", "- 10.1.0.351\n")
    line = bad.splitlines().index("        - 10.1.0.351") + 1
    assert read_fast(bad) is None
    with pytest.raises(StateFileError) as caught:
        parse_state(bad.encode(), "state.yaml")
    assert str(caught.value) == (
        f"state.yaml:{line}: services[150].endpoints[0].endpoint.ips.v4[0]: '10.1.0.351' is "
        "not an IP address")
    assert str(caught.value) == str(_strict(bad))
