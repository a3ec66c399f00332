"""The ctypes mirrors in backends/ebpf/maps/layout.py have the layout of the C
structs in bpf/lb_maps.h, as the host's C compiler lays them out, and every
MapSpec is the map sock_lb.c declares."""

from __future__ import annotations

import ctypes as ct
import re
from pathlib import Path

import pytest

from backends.ebpf.datapath.loader import BPF_SOURCE_DIR
from backends.ebpf.maps import layout as maps
from tests.support.c_layout import assert_matches_c, constants, ctypes_members

# BCC's names of the map types, and the C types of the scalar keys.
BCC_MAP_TYPES = {'"hash"': maps.BPF_MAP_TYPE_HASH, '"lru_hash"': maps.BPF_MAP_TYPE_LRU_HASH,
                 '"percpu_hash"': maps.BPF_MAP_TYPE_PERCPU_HASH,
                 '"array"': maps.BPF_MAP_TYPE_ARRAY, '"ringbuf"': maps.BPF_MAP_TYPE_RINGBUF}
PER_CPU_TYPES = {maps.BPF_MAP_TYPE_PERCPU_HASH}
SCALAR_C_TYPES: dict[type, str] = {ct.c_uint32: "__u32", maps.NoEntries: "none"}


def assert_mirrors_match(header_dir: Path, tmp_path: Path) -> None:
    checks = constants({"LB_SVC_F_AFFINITY": maps.SVC_F_AFFINITY,
                        "LB_SVC_F_EXTERNAL_IP": maps.SVC_F_EXTERNAL_IP,
                        "LB_SVC_F_LOAD_BALANCER_IP": maps.SVC_F_LOAD_BALANCER_IP,
                        "LB_SVC_F_NODE_PORT": maps.SVC_F_NODE_PORT})
    for c_name, mirror in maps.MIRRORS.items():
        checks += ctypes_members(f"struct {c_name}", mirror, exact=True)
    assert_matches_c(tmp_path, ['"lb_maps.h"'], checks, include_dirs=[header_dir])


def test_ctypes_mirrors_match_the_c_header(tmp_path: Path) -> None:
    assert_mirrors_match(BPF_SOURCE_DIR, tmp_path)


def test_the_layout_check_catches_a_reordered_field(tmp_path: Path) -> None:
    header = (BPF_SOURCE_DIR / "lb_maps.h").read_text()
    reordered = header.replace("\t__u8 proto;\t\t/* 20: IPPROTO_TCP or IPPROTO_UDP */\n"
                               "\t__u8 pad;\t\t/* 21 */\n",
                               "\t__u8 pad;\n\t__u8 proto;\n")
    assert reordered != header, "the mutation no longer applies to lb_maps.h"
    (tmp_path / "lb_maps.h").write_text(reordered)
    with pytest.raises(AssertionError, match="struct lb_service_key proto offset"):
        assert_mirrors_match(tmp_path, tmp_path)


def without_comments(c_source: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", c_source, flags=re.DOTALL)


def test_every_struct_of_the_header_has_a_mirror() -> None:
    header = without_comments((BPF_SOURCE_DIR / "lb_maps.h").read_text())
    assert set(re.findall(r"^struct (\w+) \{", header, re.MULTILINE)) == set(maps.MIRRORS)


def pinned_map_declarations(c_source: str) -> dict[str, list[str]]:
    """The arguments of each BPF_TABLE_PINNED(type, key, value, name, size,
    pin[, flags]) in the code (not in comments), by pin; a
    KPNG_RINGBUF_PINNED(name, size, pin) as ("ringbuf", none, none, name,
    size, pin)."""
    declarations = {}
    code = without_comments(c_source)
    def arguments(macro: str) -> list[list[str]]:
        return [[" ".join(part.split()) for part in found.split(",")]
                for found in re.findall(rf"\b{macro}\s*\(([^;]*)\)\s*;", code)]
    rings = [['"ringbuf"', "none", "none", *parts] for parts in arguments("KPNG_RINGBUF_PINNED")]
    for parts in arguments("BPF_TABLE_PINNED") + rings:
        pin = re.fullmatch(r'KPNG_PIN_DIR "/(\w+)"', parts[5])
        assert pin is not None, f"{parts[5]!r}: pins must be KPNG_PIN_DIR \"/name\""
        declarations[pin.group(1)] = parts
    return declarations


def _c_type(python_type: type) -> str:
    mirrored = {mirror: name for name, mirror in maps.MIRRORS.items()}
    return f"struct {mirrored[python_type]}" if python_type in mirrored else (
        SCALAR_C_TYPES[python_type])


def assert_specs_declared(c_source: str) -> None:
    """Each MapSpec's type, key, value, size macro (what --map-size-* sets),
    pin and flags are those of its declaration."""
    declared = pinned_map_declarations(c_source)
    assert set(declared) == {spec.pin for spec in maps.MAP_SPECS}
    for spec in maps.MAP_SPECS:
        map_type, key, value, _, size, _, *flags = declared[spec.pin]
        assert (BCC_MAP_TYPES[map_type], key, value, size) == (
            spec.type, _c_type(spec.key), _c_type(spec.value), spec.size_macro), spec.pin
        assert flags == (["BPF_F_NO_PREALLOC"] if spec.flags else []), spec.pin
        assert spec.per_cpu == (spec.type in PER_CPU_TYPES), spec.pin
        assert spec.flags in (0, maps.BPF_F_NO_PREALLOC), spec.pin


def test_map_specs_are_the_maps_the_program_declares() -> None:
    assert_specs_declared((BPF_SOURCE_DIR / "sock_lb.c").read_text())


@pytest.mark.parametrize("mutated", [
    # The size macro left only in a comment, a number where the code used it.
    lambda source: source.replace("kpng_services,\n\t\t KPNG_SERVICES_MAX,",
                                  "kpng_services,\n\t\t 131072 /* KPNG_SERVICES_MAX */,"),
    lambda source: source.replace('KPNG_PIN_DIR "/backends"', '"/sys/fs/bpf/backends"'),
    lambda source: source.replace('"lru_hash", struct lb_affinity_key',
                                  '"hash", struct lb_affinity_key'),
    lambda source: source.replace('KPNG_PIN_DIR "/services", BPF_F_NO_PREALLOC',
                                  'KPNG_PIN_DIR "/services"'),
], ids=["size-macro-replaced-by-a-number", "pin-dir-hard-coded", "map-type-changed",
        "flag-dropped"])
def test_the_declaration_check_catches(mutated) -> None:
    source = (BPF_SOURCE_DIR / "sock_lb.c").read_text()
    assert mutated(source) != source, "the mutation no longer applies to sock_lb.c"
    with pytest.raises(AssertionError):
        assert_specs_declared(mutated(source))
