"""A state file's services as items: texts each read alone, as they read in
place.

A file whose services are written one per item, each item a document of its
own, is read item by item (statefile.StateReader): an item whose text is the
same as in the last version read is not read again, and a big file's items
are shared between two processes (processes.py). Three layouts have such
items:

- YAML with the services one per `- ` under a top-level `services:`, at
  column 0 (what `yaml.dump` writes, block style or flow style inside) or
  indented: each item is a list of one entry;
- YAML whose top-level `services:` (at column 0) is one flow sequence,
  `services: [{service: ...}, ...]`, on one line or many;
- a document that is one flow mapping: JSON, indented or on one line, and
  YAML in flow style throughout (what `yaml.dump(..., default_flow_style=True)`
  writes), its `services` (`"services"`) sequence's entries.

A flow sequence's entries (the last two layouts) are found by their layout,
not by parsing the whole file: each entry is a mapping whose first key is
one of an entry's two (`service`, `endpoints`; plain or quoted), after the
sequence's `[` or the previous entry's `}` and one comma, with only blanks,
line breaks and comments between; the last one's `}` is followed by the
sequence's `]` (after a comma, if any) and what may follow the sequence:
the end of the line and a line at column 0 in a YAML document, the flow
mapping's `}` and the end of the text (or `, nodes:`) in a flow one. Each
entry is given as `[` entry `]`, a list of one entry as a YAML item is.

That is a guess, checked by reading. The key is a real one: the text before
it parses alone (closed with `}` in a flow document), so neither it nor the
sequence's `[` is inside a quoted scalar (a node's name may hold
`services: [{service: ...}]`), a comment or another collection. libyaml
reads a flow collection's content the same whatever its column or what
encloses it, so an entry read alone reads as in place if it starts as in
place (after `[` or a comma) and reads alone as exactly one entry
(statefile reads each item as a list of one): a piece cut inside a quoted
scalar or a nested collection leaves it open and fails to read, one cut
inside a comment fails too (the comment takes the `]`), and two entries in
one piece are two. What lies between the pieces is read by no one, so it is
matched as libyaml reads it (a comment runs to its line's end; no other
white space); the skeleton, the document with `services: []` left, must
read too, with those services, not another key's (a `services` key
elsewhere is no valid state's). Whatever does not read is read whole, by the
strict reader, which names the line.
"""

from __future__ import annotations

import re

from kpng_py.brain.plainload import libyaml_parses

# What libyaml skips between two tokens in a flow collection: blanks, line
# breaks and comments. A comment runs to the end of its line, never less,
# and stops at no line break of YAML 1.1 only (NEL, LS, PS end it to
# libyaml: the text after one would be skipped here and read there).
_GAP = r"[ \t\r\n]*+(?:#[^\r\n\x85\u2028\u2029]*+(?=[\r\n]|\Z)[ \t\r\n]*+)*+"
# An entry's start: `{` and one of its two keys, plain or quoted.
_ENTRY = (r"""\{[ \t\r\n]*"""
          r"""(?:service|endpoints|"(?:service|endpoints)"|'(?:service|endpoints)')[ \t]*:""")
# A YAML document's top-level `services:` line (searched for after a
# newline: ten times faster than `^` in multi-line mode over a big file),
# then block items (group `block`) or a flow sequence (group `open`).
_YAML_SERVICES = re.compile(r"(?:\A|\n)services:(?:[ \t]*(?P<block>\n)|[ \t]+(?P<open>\[))")
# The first block item under it (group 1: its indentation), after blank
# lines and comments.
_YAML_FIRST_ITEM = re.compile(r"(?:[ \t]*(?:#[^\n]*)?\n)*( *)- ")
# A document that is one flow mapping (JSON's included), and its services'
# key (group `key`) after `{` or a comma, and the sequence's `[` (`open`).
_FLOW_DOCUMENT = re.compile(rf"{_GAP}\{{")
_FLOW_SERVICES = re.compile(
    rf"""[{{,]{_GAP}(?P<key>services|"services"|'services')[ \t]*:{_GAP}(?P<open>\[)""")
# A flow sequence's first entry, and an entry's `}` then the next one's `{`.
_FIRST_ENTRY = re.compile(rf"{_GAP}(?={_ENTRY})")
_BETWEEN = re.compile(rf"\}}{_GAP},{_GAP}(?={_ENTRY})\{{")


def _last_entrys_end(after_sequence: str) -> re.Pattern[str]:
    """An entry's `}`, a comma or none, the sequence's `]` and what may
    follow it."""
    return re.compile(rf"\}}{_GAP}(?:,{_GAP})?\](?={after_sequence})")


# After the sequence of a YAML document: a comment, the line's end, and a
# line at column 0 (an entry's lines go on indented, as yaml.dump writes).
_YAML_END = _last_entrys_end(r"[ \t]*(?:#[^\r\n]*)?\r?(?:\n(?![ \t])|\Z)")
# After that of a flow document: its end, or the other top-level key.
_FLOW_END = _last_entrys_end(
    rf"""{_GAP}(?:\}}{_GAP}\Z|,{_GAP}(?:nodes|"nodes"|'nodes')[ \t]*:)""")


def split_services(text: str) -> tuple[str, list[str]]:
    """The document without its services' items, and those items' texts; a
    document without such items is its own skeleton (not copied: it may be
    big), and no items."""
    # The services' key is a real one, not text inside a quoted scalar, a
    # comment or another flow collection, only if the text before it parses
    # (closed with `}` in a flow document).
    if _FLOW_DOCUMENT.match(text):
        found = _FLOW_SERVICES.search(text)
        if found is None or not libyaml_parses(text[:found.start("key")] + "}"):
            return text, []
        return _split_flow(text, found.start("open"), _FLOW_END)
    found = _YAML_SERVICES.search(text)
    if found is None or not libyaml_parses(text[:found.start()]):
        return text, []
    if found["open"]:
        return _split_flow(text, found.start("open"), _YAML_END)
    return _split_block(text, found.end())


def _split_block(text: str, after_key: int) -> tuple[str, list[str]]:
    """The items under `services:`, each starting with `- ` at the
    indentation of the first; they end at the first line that is less
    indented, or as indented but not an item (blank lines and comments
    aside). Each item keeps its indentation: read alone, a sequence of one
    entry, as in place."""
    first = _YAML_FIRST_ITEM.match(text, after_key)
    if not first:
        return text, []
    indent = first[1]
    start = first.end() - len(indent) - 2
    after = re.compile(f"\n(?!{indent}- )(?= {{0,{len(indent)}}}[^\\s#])").search(text, start)
    end = after.start() + 1 if after else len(text)
    starts = [start, *(match.start() + 1
                       for match in re.compile(f"\n{indent}- ").finditer(text, start, end))]
    items = [text[a:b] for a, b in zip(starts, [*starts[1:], end])]
    return text[:start] + text[end:], items


def _split_flow(text: str, opening: int, last_end: re.Pattern[str]) -> tuple[str, list[str]]:
    """The entries of the flow sequence whose `[` is at `opening`, by their
    layout; the skeleton keeps `[]`."""
    first = _FIRST_ENTRY.match(text, opening + 1)
    if first is None:
        return text, []
    starts, ends = [first.end()], []
    for between in _BETWEEN.finditer(text, first.end()):
        ends.append(between.start() + 1)
        starts.append(between.end() - 1)
    last = last_end.search(text, starts[-1])
    if last is None:
        return text, []
    ends.append(last.start() + 1)
    return (text[:opening + 1] + text[last.end() - 1:],
            [f"[{text[start:end]}]" for start, end in zip(starts, ends)])
