"""Compare Python definitions of C layouts and numbers with what the host's
gcc makes of the C headers.

A check is a label, a C integer expression and the value the Python side
gives it. One generated C program prints every expression; the test compares
the two {label: value} tables, so a failure lists each mismatch by name.
"""

from __future__ import annotations

import ctypes as ct
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pytest


@dataclass(frozen=True)
class Check:
    label: str
    c_expression: str
    python_value: int


def require_gcc() -> None:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc (hack/setup.sh --dev installs it) to compile the C headers")


def constants(values: Mapping[str, int]) -> list[Check]:
    """Python constants named as the C macro or enum member they copy."""
    return [Check(name, name, int(value)) for name, value in values.items()]


def _member_size(c_type: str, path: str) -> str:
    return f"sizeof((({c_type} *)0)->{path})"


def ctypes_members(c_type: str, mirror: type[ct.Structure], exact: bool) -> list[Check]:
    """Offset and size of every field of a ctypes mirror (nested structures
    field by field, as C member paths), and its size: equal to the C type's
    when `exact`, else no larger (a prefix the kernel fills)."""
    checks = [Check(f"{c_type} {path} offset", f"offsetof({c_type}, {path})", offset)
              for path, offset, _ in _fields(mirror)]
    checks += [Check(f"{c_type} {path} size", _member_size(c_type, path), size)
               for path, _, size in _fields(mirror)]
    if exact:
        checks += [Check(f"{c_type} size", f"sizeof({c_type})", ct.sizeof(mirror)),
                   Check(f"{c_type} align", f"_Alignof({c_type})", ct.alignment(mirror))]
    else:
        checks.append(Check(f"{c_type} holds the mirror",
                            f"sizeof({c_type}) >= {ct.sizeof(mirror)}", 1))
    return checks


def _fields(mirror: type[ct.Structure], prefix: str = "",
            base: int = 0) -> Iterable[tuple[str, int, int]]:
    """(C member path, offset from the outer struct, size) of each field."""
    for name, field_type, *_ in mirror._fields_:
        offset = base + getattr(mirror, name).offset
        path = f"{prefix}{name}"
        yield path, offset, ct.sizeof(field_type)
        if isinstance(field_type, type) and issubclass(field_type, ct.Structure):
            yield from _fields(field_type, f"{path}.", offset)


_ITEM = re.compile(r"(\d*)([xcbB?hHiIlLqQnNefdspP])")


def packed_members(c_type: str, packing: struct.Struct, members: Sequence[str],
                   base: int = 0) -> list[Check]:
    """Offset and size of each item of a struct.Struct format (standard
    sizes, no alignment: "=", "<", ">" or "!"), in order, against the C
    members it packs; pad bytes ("x") are not members. `base` is where the
    packing starts in the C type."""
    fmt = packing.format
    if fmt[:1] not in ("=", "<", ">", "!"):
        raise ValueError(f"{fmt!r}: give a standard byte order, or offsets depend on alignment")
    items, offset = [], base
    for count, code in _ITEM.findall(fmt[1:]):
        size = struct.calcsize("=" + count + code)
        if code != "x":
            items.append((offset, size))
        offset += size
    if len(items) != len(members):
        raise ValueError(f"{fmt!r} packs {len(items)} items, {len(members)} members named")
    checks = []
    for member, (item_offset, size) in zip(members, items):
        checks.append(Check(f"{c_type} {member} offset", f"offsetof({c_type}, {member})",
                            item_offset))
        checks.append(Check(f"{c_type} {member} size", _member_size(c_type, member), size))
    return checks


def _program(includes: Sequence[str], checks: Sequence[Check]) -> str:
    lines = [f"#include {header}" for header in ("<stdio.h>", "<stddef.h>", *includes)]
    lines.append("int main(void) {")
    lines += [f'  printf("%s=%lld\\n", "{check.label}", (long long)({check.c_expression}));'
              for check in checks]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def c_values(tmp_path: Path, includes: Sequence[str], checks: Sequence[Check],
             include_dirs: Sequence[Path] = ()) -> dict[str, int]:
    """What gcc says each check's expression is, by label."""
    require_gcc()
    source, binary = tmp_path / "layout.c", tmp_path / "layout"
    source.write_text(_program(includes, checks))
    compiled = subprocess.run(["gcc", "-Wall", "-Werror", *(f"-I{d}" for d in include_dirs),
                               "-o", str(binary), str(source)], capture_output=True, text=True)
    assert compiled.returncode == 0, f"gcc failed on {source}:\n{compiled.stderr}"
    printed = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {label: int(value) for label, value in
            (line.rsplit("=", 1) for line in printed.splitlines())}


def assert_matches_c(tmp_path: Path, includes: Sequence[str], checks: Sequence[Check],
                     include_dirs: Sequence[Path] = ()) -> None:
    labels = [check.label for check in checks]
    assert len(set(labels)) == len(labels), "two checks share a label"
    expected = {check.label: check.python_value for check in checks}
    actual = c_values(tmp_path, includes, checks, include_dirs)
    mismatched = {label: {"python": expected[label], "C": actual.get(label)}
                  for label in expected if actual.get(label) != expected[label]}
    assert not mismatched, mismatched
