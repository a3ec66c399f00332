"""Endpoints read a whole endpoint at a time (fastendpoints.py) read as the
other readers read them, and the items it cannot vouch for are left to them."""

from __future__ import annotations

import random

import pytest
import yaml

from kpng_py.brain.blockyaml import Scalars
from kpng_py.brain.fastendpoints import IPV4, FastEndpoints
from kpng_py.brain.statefile import StateReader, _split_services, read_strict
from tests.brain.helpers import state
from tests.brain.test_fastpath import TRICKY_SCALARS


def generated_endpoint(pod: str, *ips: str, node: str = "node-b",
                       overrides: tuple[tuple[str, int], ...] = (("http", 8080),)) -> dict:
    """An endpoint as bench/e2e_sync.py writes one (pod name first)."""
    return {"podname": pod,
            "endpoint": {"ips": {"v4": list(ips)},
                         "portoverrides": [{"name": n, "port": p} for n, p in overrides]},
            "topology": {"node": node}}


def generated_service(index: int) -> dict:
    """A service as bench/e2e_sync.py writes one (keys in this order)."""
    ports = [{"name": "http", "protocol": 1, "port": 80, "targetport": 8080}]
    if index % 2:
        ports.append({"name": "dns", "protocol": 2, "port": 53, "targetport": 0})
    cluster_ips = [f"10.96.{i}.{index + 10}" for i in range(1 + index % 2)]
    return {"namespace": "bench", "name": f"svc-{index}", "type": "ClusterIP",
            "ips": {"clusterips": {"v4": cluster_ips}},
            "ports": ports}


def generated_file(sort_keys: bool, services: int = 6) -> str:
    items = [{"service": generated_service(s), "endpoints": [
        generated_endpoint(f"pod-{e}", *(f"10.244.{s}.{e * 3 + i}" for i in range(1 + e % 3)),
                           node=f"node-{e % 2}",
                           overrides=(("http", 8080 + e),) + ((("dns", 53),) if e % 2 else ()))
        for e in range(4)]} for s in range(services)]
    return yaml.safe_dump(state(*items, nodes=[{"name": "node-0"}]), sort_keys=sort_keys)


def _lane_reads_every_item(text: str) -> bool:
    fast = FastEndpoints(Scalars())
    return all(fast.split(item) is not None for item in _split_services(text)[1])


@pytest.mark.parametrize("sort_keys", [False, True])
def test_generated_endpoints_are_read_whole_and_read_the_same(sort_keys: bool) -> None:
    text = generated_file(sort_keys)
    assert _lane_reads_every_item(text)
    assert StateReader("state.yaml").read_fast(text) == read_strict(text, "state.yaml")


def _mutated(text: str, rng: random.Random) -> str:
    """One to three lines of the endpoints changed: a scalar replaced, a line
    dropped, repeated, commented or indented."""
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        at = rng.choice([i for i, line in enumerate(lines) if line.startswith("    ")])
        line = lines[at]
        choice = rng.randrange(5)
        if choice == 0 and ": " in line:
            lines[at] = f"{line.partition(': ')[0]}: {rng.choice(TRICKY_SCALARS)}"
        elif choice == 1 and line.lstrip().startswith("- ") and ":" not in line:
            lines[at] = f"{line.partition('- ')[0]}- {rng.choice(TRICKY_SCALARS)}"
        elif choice == 2:
            lines.insert(at, rng.choice((line, "    # a comment", "")))
        elif choice == 3:
            lines[at] = "  " + line
        else:
            del lines[at]
    return "\n".join(lines) + "\n"


def test_mutated_endpoints_read_the_same_as_the_strict_reader() -> None:
    """Whatever the fast path accepts of a mutated generated file, the strict
    reader accepts and reads the same; both outcomes happen."""
    rng = random.Random(14)
    texts = [generated_file(sort_keys) for sort_keys in (False, True)]
    accepted = rejected = 0
    for round_ in range(400):
        text = _mutated(rng.choice(texts), rng)
        fast = StateReader("state.yaml").read_fast(text)
        try:
            strict = read_strict(text, "state.yaml")
        except ValueError:
            assert fast is None, (round_, text)
            rejected += 1
            continue
        if fast is not None:
            assert fast == strict, (round_, text)
            accepted += 1
    assert accepted > 40 and rejected > 40


@pytest.mark.parametrize("change", [
    ("- 10.244.0.0\n", "- fd00::1\n"),  # not IPv4
    ("- 10.244.0.0\n", "- 10.244.0.300\n"),  # not an address
    ("        port: 8080\n", "        port: 0\n"),  # no port
    ("        port: 8080\n", "        port: '8080'\n"),  # quoted
    ("podname: pod-0\n", "podname: 'null'\n"),
    ("node: node-0\n", "node: yes\n"),
    ("podname: pod-1\n", "podname: pod-0\n"),  # two endpoints, one key
    ("      - name: http\n", "      - name: http # c\n"),
    ("\n  endpoints:\n", "\n  endpoints: []\n  endpoints:\n"),  # given twice
])
def test_what_it_cannot_vouch_for_is_left_to_the_other_readers(change: tuple[str, str]) -> None:
    changed = changed_file(*change)
    if "endpoints: []" not in change[1]:  # that one the state reader declines
        assert not _lane_reads_every_item(changed)
    assert_read_as_strictly(changed)


def changed_file(old: str, new: str) -> str:
    """A generated file of one service, `old` changed to `new` once."""
    text = generated_file(sort_keys=False, services=1)
    changed = text.replace(old, new, 1)
    assert changed != text
    return changed


def assert_read_as_strictly(text: str) -> None:
    """The fast path declines what the strict reader rejects, and reads the
    same what it does not decline."""
    fast = StateReader("state.yaml").read_fast(text)
    try:
        strict = read_strict(text, "state.yaml")
    except ValueError:
        assert fast is None
        return
    assert fast is None or fast == strict


def test_dotted_quads_are_strings_to_yaml() -> None:
    """Addresses that match IPV4 are not resolved as scalars: YAML 1.1 reads
    every one of them as the string it is."""
    quads = ["0.0.0.0", "255.255.255.255", "1.2.3.4", "10.96.0.10", "192.168.100.200"]
    rng = random.Random(4)
    quads += [".".join(str(rng.randrange(256)) for _ in range(4)) for _ in range(200)]
    for quad in quads:
        assert IPV4.fullmatch(quad)
        assert yaml.safe_load(f"a: {quad}") == {"a": quad}
