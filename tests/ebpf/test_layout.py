"""The ctypes mirrors in backends/ebpf/maps.py have the layout of the C
structs in bpf/lb_maps.h, as the host's C compiler lays them out."""

from __future__ import annotations

import ctypes as ct
import shutil
import subprocess
from pathlib import Path

import pytest

from backends.ebpf import maps
from backends.ebpf.loader import BPF_SOURCE_DIR


def _layout_program(mirrors: dict[str, type[ct.Structure]]) -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "lb_maps.h"',
             "int main(void) {",
             '  printf("LB_SVC_F_AFFINITY %d\\n", LB_SVC_F_AFFINITY);']
    for c_name, mirror in mirrors.items():
        struct = f"struct {c_name}"
        lines.append(f'  printf("{c_name} size %zu align %zu\\n", sizeof({struct}), '
                     f"_Alignof({struct}));")
        for field, *_ in mirror._fields_:
            lines.append(f'  printf("{c_name}.{field} %zu\\n", offsetof({struct}, {field}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _expected(mirrors: dict[str, type[ct.Structure]]) -> list[str]:
    lines = [f"LB_SVC_F_AFFINITY {maps.SVC_F_AFFINITY}"]
    for c_name, mirror in mirrors.items():
        lines.append(f"{c_name} size {ct.sizeof(mirror)} align {ct.alignment(mirror)}")
        lines += [f"{c_name}.{field} {getattr(mirror, field).offset}"
                  for field, *_ in mirror._fields_]
    return lines


def test_ctypes_mirrors_match_the_c_header(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to compile bpf/lb_maps.h for the host")
    source = tmp_path / "layout.c"
    source.write_text(_layout_program(maps.MIRRORS))
    binary = tmp_path / "layout"
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{BPF_SOURCE_DIR}", "-o", str(binary),
                    str(source)], check=True, capture_output=True, text=True)
    printed = subprocess.run([str(binary)], check=True, capture_output=True,
                             text=True).stdout.splitlines()
    assert printed == _expected(maps.MIRRORS)


def test_every_struct_of_the_header_has_a_mirror() -> None:
    header = (BPF_SOURCE_DIR / "lb_maps.h").read_text()
    declared = {line.split()[1] for line in header.splitlines()
                if line.startswith("struct ") and line.rstrip().endswith("{")}
    assert declared == set(maps.MIRRORS)


def test_map_specs_name_the_macros_the_program_uses() -> None:
    program = (BPF_SOURCE_DIR / "sock_lb.c").read_text()
    for spec in maps.MAP_SPECS:
        assert spec.size_macro in program
        assert f'KPNG_PIN_DIR "/{spec.pin}"' in program
