"""A state file's services as items: texts each read alone, as they read in
place.

A file whose services are written one per item, each item a document of its
own, is read item by item (statefile.StateReader): an item whose text is the
same as in the last version read is not read again, and a big file's items
are shared between two processes (processes.py). Two layouts have such
items:

- YAML with the services one per column-0 `- ` under a top-level
  `services:` (what `yaml.dump` writes, block style or flow style inside):
  each item is a list of one entry;
- JSON written one value a line (`json.dumps(..., indent=N)`, `jq`, Go's
  `MarshalIndent`): the items of the top-level `"services"` array, found by
  the indentation of its first item; each is given wrapped in `[` `]`, a
  list of one entry as a YAML item is.

The JSON split is only a guess at the array's items from the layout (a
compact, one-line JSON file has none), checked by reading: the items are
separated by exactly one comma, and each must read alone as one complete
value, so that the array they are cut from holds exactly those values (a
JSON value's extent does not depend on what follows it). A cut that makes an
item that is not one value fails to read, and the file is then read whole,
by the strict reader.
"""

from __future__ import annotations

import re

# A line that starts at column 0 and is not a comment: the first line, and
# any after a newline (searched for as such: ten times faster than `^` in
# multi-line mode over a big file).
_TOP_LINE = re.compile(r"[^\s#]")
_NEXT_TOP_LINE = re.compile(r"\n[^\s#]")
# A JSON document's opening and the indentation of its first key.
_JSON_FIRST_KEY = re.compile(r"\s*\{[ \t]*\n([ \t]*)\"")
# A `"services": [` line (its indentation: group 1) and the indentation of
# the line after it (group 2) if that line opens an object.
_JSON_SERVICES = re.compile(r"\n([ \t]*)\"services\"[ \t]*:[ \t]*\[[ \t]*\n(?:([ \t]*)\{)?")
_JSON_SPACE = " \t\r\n"


def split_services(text: str) -> tuple[str, list[str]]:
    """The document without its services' items, and those items' texts; a
    document without such items is its own skeleton (not copied: it may be
    big), and no items."""
    first_key = _JSON_FIRST_KEY.match(text)
    if first_key is not None:
        return _split_json(text, first_key[1])
    return _split_yaml(text)


def _split_yaml(text: str) -> tuple[str, list[str]]:
    """A top-level `services:` with its items one per column-0 `- `."""
    starts = ([0] if _TOP_LINE.match(text) else []) + [
        match.start() + 1 for match in _NEXT_TOP_LINE.finditer(text)] + [len(text)]
    skeleton = [text[:starts[0]]]
    items: list[str] = []
    in_services = False
    for start, end in zip(starts, starts[1:]):
        chunk = text[start:end]
        if in_services and chunk.startswith("- "):
            items.append(chunk)
            continue
        in_services = chunk[:10] in ("services:\n", "services:")
        skeleton.append(chunk)
    return ("".join(skeleton), items) if items else (text, [])


def _split_json(text: str, key_indent: str) -> tuple[str, list[str]]:
    """The top-level `"services"` array's items, each starting on a line of
    its own at the indentation of the first (the document's keys at
    `key_indent`, its first key's)."""
    found = next((match for match in _JSON_SERVICES.finditer(text)
                  if match[1] == key_indent and match[2] is not None), None)
    if found is None:
        return text, []
    top, inner = found[1], found[2]
    body = found.end() - len(inner) - 1  # the first item's line
    end = text.find(f"\n{top}]", body)
    if end < 0:
        return text, []
    item_start = re.compile(f"\n{inner}\\{{")
    starts = [match.start() for match in item_start.finditer(text, body - 1, end)]
    items = []
    for start, after in zip(starts, [*starts[1:], end]):
        item = text[start:after].rstrip(_JSON_SPACE)
        last = after == end
        if item.endswith(",") == last:
            return text, []  # not one comma between items, or one after the last
        items.append(f"[{item if last else item[:-1]}]")
    return text[:body] + text[end:], items
