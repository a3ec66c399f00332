"""A fast reader for the plain block style that `yaml.dump` writes, into plain
values; anything else is left to the full reader.

State files are big (10 000 services of 10 endpoints: 19.5 MB, 1.1 million
lines) and PyYAML composes and constructs each node in Python, even with
libyaml (about 40 s for that file on a loaded 2-core machine). Generated
files use a small part of YAML: block mappings and sequences, one-line plain
or quoted scalars, `[]` and `{}`, comment lines. This module reads exactly
that part, line by line, into dicts, lists, str, int, bool and None, and
raises `NotBlockStyle` at the first thing outside it (a flow collection with
content, an anchor, a tag, a multi-line scalar, a duplicate key, a scalar
that YAML 1.1 reads as a float, a timestamp, an octal number...). The caller
then reads the document with the full, strict reader, which gives the same
result for every document read here (tests/brain/test_fastpath.py checks
that on mutated files) and the line-aware error for every bad one.

Scalars are read as PyYAML's resolver reads them, narrowed so that the text
can be recovered from the value (a string field takes a scalar's text):
`true`/`false` are booleans, decimal numbers without leading zeros are ints,
`null` and an empty value are None, a plain scalar that any other implicit
resolver of PyYAML claims is not block style, everything else is a string.
"""

from __future__ import annotations

import re

import yaml

Plain = dict | list | str | int | bool | None


class NotBlockStyle(Exception):
    """The document uses YAML beyond the plain block style read here."""


# Control characters, tabs and carriage returns included: the fast path reads
# printable ASCII and newlines only.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")
# One-line plain scalars of a safe alphabet: no indicator first, no `: `,
# no ` #`, no trailing `:` (which would make a mapping key).
_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]*(?: [A-Za-z0-9_./:@+=-]+)*")
_INT = re.compile(r"0|-?[1-9][0-9]*")
_WORDS: dict[str, bool | None] = {"true": True, "false": False, "null": None,
                                  "Null": None, "NULL": None, "~": None}
_RESOLVERS = yaml.resolver.Resolver.yaml_implicit_resolvers
_UNKNOWN = object()


def load_block(text: str, scalars: Scalars | None = None) -> Plain:
    """The document's plain value; NotBlockStyle if it is not plain block style.

    One pass over the lines with a stack of the open collections and their
    indents. A `key:` or `-` without a value on its line leaves a pending
    value: the next line opens a collection under it (deeper, or a sequence
    at the key's own indent), or it is null. `scalars` may carry the scalars
    resolved from one document to the next (the parts of one file)."""
    if not text.isascii() or _CONTROL.search(text):
        raise NotBlockStyle("text beyond printable ASCII (tabs, other line breaks...)")
    root: Plain = None
    stack: list[tuple[int, dict | list]] = []
    pending: tuple[dict | list, str | int, int] | None = None  # (parent, key, its indent)
    scalars = scalars or Scalars()
    keys = scalars.keys
    for line in text.split("\n"):
        content = line.lstrip(" ")
        if not content or content[0] == "#":
            continue
        if content[-1] == " ":
            raise NotBlockStyle("trailing spaces")
        indent = len(line) - len(content)
        is_item = content[0] == "-" and (len(content) == 1 or content[1] == " ")
        if pending is not None:
            parent, key, parent_indent = pending
            pending = None
            if indent > parent_indent or (indent == parent_indent and is_item
                                          and type(parent) is dict):
                opened: dict | list = [] if is_item else {}
                # The key is an int exactly when the parent is a list (`pending`
                # pairs them), which the type of the tuple cannot say.
                parent[key] = opened  # type: ignore[index]
                stack.append((indent, opened))
        elif not stack:
            if root is not None or indent != 0:
                raise NotBlockStyle("more after the root, or an indented root")
            root = [] if is_item else {}
            stack.append((0, root))
        while stack[-1][0] > indent:
            stack.pop()
            if not stack:
                raise NotBlockStyle("a line left of the root")
        top_indent, top = stack[-1]
        if top_indent != indent:
            raise NotBlockStyle("a line between two indents")
        if type(top) is list:
            if not is_item:  # an indentless sequence ends at its key's indent
                stack.pop()
                if not stack or stack[-1][0] != indent or type(stack[-1][1]) is not dict:
                    raise NotBlockStyle("a key after a sequence item")
                top = stack[-1][1]
            elif content == "-":
                pending = (top, len(top), indent)
                top.append(None)
                continue
            else:
                content = content[2:]
                if not (content.endswith(":") or ": " in content):
                    if content[0] == "-" and (content == "-" or content[1] == " "):
                        raise NotBlockStyle("a sequence inside a sequence on one line")
                    top.append(scalars.read(content))
                    continue
                # A mapping that starts on the item's line, its keys two columns in.
                indent += 2
                opened = {}
                top.append(opened)
                stack.append((indent, opened))
                top = opened
        elif is_item:
            raise NotBlockStyle("a sequence item where a key belongs")
        if content[-1] == ":":
            key, value = content[:-1], None
        else:
            key, colon, value = content.partition(": ")
            if not colon:
                raise NotBlockStyle("a line that is not a key and value")
        if key not in keys:
            if not _KEY.fullmatch(key):
                raise NotBlockStyle(f"the key {key!r}")
            keys.add(key)
        if key in top:
            raise NotBlockStyle(f"the key {key!r} repeated")
        # `top` is a dict here (a list top was left for its dict above), which
        # mypy does not follow through `type(top) is list`.
        if value is None:
            top[key] = None  # type: ignore[call-overload]
            pending = (top, key, indent)
        else:
            top[key] = scalars.read(value)  # type: ignore[call-overload]
    return root


class Scalars:
    """Each distinct scalar text is resolved once, each key checked once."""

    def __init__(self) -> None:
        self._known: dict[str, str | int | bool | None] = {}
        self.keys: set[str] = set()

    def read(self, text: str) -> Plain:
        value = self._known.get(text, _UNKNOWN)
        if value is _UNKNOWN:  # `[]` and `{}` are never known: each is a new value
            if text == "[]":
                return []
            if text == "{}":
                return {}
            value = self._known[text] = _scalar(text)
        # Not the sentinel here, which mypy cannot narrow an object() to.
        return value  # type: ignore[return-value]


def _scalar(text: str) -> str | int | bool | None:
    if text in _WORDS:
        return _WORDS[text]
    first = text[0]
    if first == "'" or first == '"':
        if len(text) < 2 or text[-1] != first:
            raise NotBlockStyle("a scalar quoted over more than one line")
        body = text[1:-1]
        if first == "'":
            if "'" in body.replace("''", ""):
                raise NotBlockStyle("a single quote inside a single-quoted scalar")
            return body.replace("''", "'")
        if "\\" in body or '"' in body:
            raise NotBlockStyle("an escape in a double-quoted scalar")
        return body
    if not _PLAIN.fullmatch(text) or ": " in text:
        raise NotBlockStyle(f"the scalar {text!r}")
    if _INT.fullmatch(text):
        return int(text)
    if any(rx.match(text) for _, rx in _RESOLVERS.get(first, ())):
        raise NotBlockStyle(f"the scalar {text!r} has a type of its own")
    return text
