"""A state file's services as items: texts each read alone, as they read in
place.

A file whose services are written one per item, each item a document of its
own, is read item by item (statefile.StateReader): an item whose text is the
same as in the last version read is not read again, and a big file's items
are shared between two processes (processes.py). Two layouts have such
items:

- YAML with the services one per `- ` under a top-level `services:`, at
  column 0 (what `yaml.dump` writes, block style or flow style inside) or
  indented: each item is a list of one entry;
- JSON, indented or on one line: the entries of the `"services"` array,
  each given wrapped in `[` `]`, a list of one entry as a YAML item is.

A JSON array's entries are found by their layout, not by parsing the whole
file: the array opens with `"services": [` and each entry is an object whose
first key is one of an entry's two (`service`, `endpoints`), after the
previous entry's `}` and one comma; the last one ends where a JSON decoder
says, before the array's `]`. That is a guess (an object inside an entry may
look the same), checked by reading: each piece must read alone as one
complete value, and as a JSON value's extent does not depend on what
follows it, the array holds exactly those values. A piece cut inside an
entry fails to read, and the file is then read whole, by the strict reader.

In either layout the services' key is a real one only if the text before it
parses alone (closed with `}` in JSON): else it is inside a quoted scalar
(a node's name may hold `services:` and entries) or a comment, and the file
is read whole.
"""

from __future__ import annotations

import json
import re

import yaml

# A top-level `services:` line (searched for after a newline: ten times
# faster than `^` in multi-line mode over a big file).
_YAML_SERVICES = re.compile(r"(?:\A|\n)services:[ \t]*\n")
# The first item under it (group 1: its indentation), after blank lines and
# comments.
_YAML_FIRST_ITEM = re.compile(r"(?:[ \t]*(?:#[^\n]*)?\n)*( *)- ")
# A JSON document's opening.
_JSON_DOCUMENT = re.compile(r"\s*\{")
# The services array's opening, before its first entry.
_JSON_SERVICES = re.compile(r'"services"\s*:\s*\[\s*(?=\{\s*"(?:service|endpoints)"\s*:)')
# The end of one entry, one comma, the start of the next (group 1), with
# only YAML's blanks and line breaks between (not what else `\s` takes: no
# reader reads this text, and libyaml takes no other white space there).
_JSON_BETWEEN = re.compile(
    r'\}[ \t\r\n]*,[ \t\r\n]*(\{)[ \t\r\n]*"(?:service|endpoints)"[ \t\r\n]*:')
_JSON_ARRAY_END = re.compile(r"\s*\]")
_JSON_DECODER = json.JSONDecoder()


def split_services(text: str) -> tuple[str, list[str]]:
    """The document without its services' items, and those items' texts; a
    document without such items is its own skeleton (not copied: it may be
    big), and no items."""
    if _JSON_DOCUMENT.match(text):
        return _split_json(text)
    return _split_yaml(text)


def _split_yaml(text: str) -> tuple[str, list[str]]:
    """A top-level `services:` and the items under it, each starting with
    `- ` at the indentation of the first; they end at the first line that
    is less indented, or as indented but not an item (blank lines and
    comments aside). Each item keeps its indentation: read alone, a
    sequence of one entry, as in place."""
    found = _YAML_SERVICES.search(text)
    first = found and _YAML_FIRST_ITEM.match(text, found.end())
    if not first or not _parses(text[:found.start()]):
        return text, []
    indent = first[1]
    start = first.end() - len(indent) - 2
    after = re.compile(f"\n(?!{indent}- )(?= {{0,{len(indent)}}}[^\\s#])").search(text, start)
    end = after.start() + 1 if after else len(text)
    starts = [start, *(match.start() + 1
                       for match in re.compile(f"\n{indent}- ").finditer(text, start, end))]
    items = [text[a:b] for a, b in zip(starts, [*starts[1:], end])]
    return text[:start] + text[end:], items


def _split_json(text: str) -> tuple[str, list[str]]:
    """The `"services"` array's entries, by their layout."""
    found = _JSON_SERVICES.search(text)
    if found is None or not _parses(text[:found.start()] + "}"):
        return text, []
    starts, ends = [found.end()], []
    for between in _JSON_BETWEEN.finditer(text, found.end()):
        ends.append(between.start() + 1)
        starts.append(between.start(1))
    try:
        _, end = _JSON_DECODER.raw_decode(text, starts[-1])
    except ValueError:
        return text, []
    if not _JSON_ARRAY_END.match(text, end):
        return text, []
    ends.append(end)
    return (text[:found.end()] + text[end:],
            [f"[{text[start:stop]}]" for start, stop in zip(starts, ends)])


def _parses(text: str) -> bool:
    """Whether libyaml parses the text (its syntax only, in C). The text
    before the services' key parses (closed with `}` in a JSON document)
    only if the key is not inside a quoted scalar, a comment or another
    flow collection: a real key, not text that looks like one."""
    try:
        yaml.CSafeLoader(text).raw_parse()
    except yaml.YAMLError:
        return False
    return True
