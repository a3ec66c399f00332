"""A state file's text as plain values, read by fast parsers, or `Unchecked`
where their reading could differ from the strict reader's.

The strict reader (reader.py) composes the document with libyaml and
resolves scalars as PyYAML does (YAML 1.1), keeping every node's line: right,
but about 15 s and 1 GB for a file of 10 000 services in flow style. Here the
same text is read into dicts, lists, str, int, bool, float and None by parsers
that build them in compiled code: `json` for a JSON text, yaml-rs (a YAML 1.2
parser in Rust) for any other. The caller reads those values through
`PlainValue` (the same accessors as the strict reader's), and on any doubt or
problem reads the text again with the strict reader, which names the line.

So every text read here must read as the strict reader reads it, or be
declined. What is declined (the strict reader then reads it, slowly):

- text that libyaml does not parse (its own parser checks the syntax, in C,
  without building anything): the strict reader's syntax error, with its line;
- YAML 1.1's line breaks that YAML 1.2 reads as text (NEL, LS, PS) and a
  byte order mark;
- node properties and directives (tags `!`, anchors `&`, aliases `*`, `%`):
  the strict reader types tagged values and counts aliases (reader.py);
- a plain number with a leading zero or `0o` (`010`: 8 in YAML 1.1, 10 in
  YAML 1.2), where the two versions read different integers;
- a key given twice in one mapping.

The other differences between the versions' scalars are declined by
`PlainValue`'s accessors: a string field takes only a string (YAML 1.1 takes
any scalar's text, which a typed value does not tell), no accessor takes a
float, a bool field takes only YAML 1.2's booleans (`true`, `True`, `TRUE` and
the same for false: booleans in YAML 1.1 too). tests/brain/test_plainload.py
reads mutated files both ways and compares.
"""

from __future__ import annotations

import json
import re

import yaml
import yaml_rs

Plain = dict | list | str | int | bool | float | None


class Unchecked(Exception):
    """The fast reader found something it does not vouch for: read the
    document with the strict reader."""


# YAML 1.1's line breaks that YAML 1.2 reads as text, and a byte order mark.
_LINE_BREAKS = re.compile("[\x85\u2028\u2029\ufeff]")
# A tag, an anchor or an alias (where a node may start), or a directive.
_PROPERTIES = re.compile(r"(?:^|[\s\[{,])[!&*]|^%", re.MULTILINE)
# A zero and then a digit, `o` or `_`: `010`, `0o10`, `0_10` read as other
# integers in YAML 1.1 when they are a whole plain scalar.
_ZERO_THEN = re.compile(r"0[0-9oO_]")
_NUMBER_START = frozenset(" \t\r\n[{,")
_JSON_START = re.compile(r"\s*[{\[]")


def _unvouched(text: str) -> str | None:
    """What in the text YAML 1.1 (libyaml) and YAML 1.2 (yaml-rs) may read
    apart, or None. Found anywhere, also inside a quoted scalar, where both
    read it the same (such a file is only read slowly). Each search is made
    only when a character it needs is in the text at all."""
    if not text.isascii() and _LINE_BREAKS.search(text):
        return "a line break of YAML 1.1 only, or a byte order mark"
    if any(c in text for c in "!&*%") and _PROPERTIES.search(text):
        return "a tag, an anchor, an alias or a directive"
    for found in _ZERO_THEN.finditer(text):
        before = found.start() - 1
        if before >= 0 and text[before] in "+-":
            before -= 1
        if before < 0 or text[before] in _NUMBER_START:
            return "a number with a leading zero"
    return None


def plain_document(text: str, data: bytes | None = None) -> Plain:
    """The document's plain values; Unchecked where the strict reader may
    read it otherwise (or not at all). `data`: the text's UTF-8 bytes, if the
    caller has them: libyaml reads UTF-8, and a big text's copy would stay
    in the process's heap (the allocator keeps such a block once freed)."""
    doubt = _unvouched(text)
    if doubt is not None:
        raise Unchecked(doubt)
    if not libyaml_parses(text if data is None else data):
        raise Unchecked("not valid YAML to libyaml")
    if _JSON_START.match(text):
        try:
            return json.loads(text, object_pairs_hook=_mapping)
        except ValueError:
            pass  # YAML's flow style, not JSON
    try:
        return yaml_rs.loads(text, parse_datetime=False,
                             duplicate_key_policy=yaml_rs.DuplicateKeyPolicy.Error)
    except yaml_rs.YAMLDecodeError as err:
        raise Unchecked(str(err)) from err
    except TypeError as err:  # a key that is a mapping or holds a list: no dict key
        raise Unchecked(f"a key Python cannot hold ({err})") from err


def libyaml_parses(text: str | bytes) -> bool:
    """Whether libyaml, the strict reader's parser, parses the text: its
    syntax only, checked in C without building anything."""
    try:
        yaml.CSafeLoader(text).raw_parse()
    except yaml.YAMLError:
        return False
    return True


def _mapping(pairs: list[tuple[str, Plain]]) -> dict[str, Plain]:
    """A JSON object; a key given twice is not read here (json keeps the last)."""
    mapping = dict(pairs)
    if len(mapping) < len(pairs):
        raise Unchecked("a key given twice")
    return mapping
