"""Recordings of localv1 Watch streams (what `kpng-py record` writes and
`kpng-py replay` serves).

Format: JSON Lines, UTF-8. The first line is a header,
``{"format": "kpng-py-recording", "version": 1}``. Every other line is one of

* ``{"op": OPITEM}``: one OpItem exactly as received, in protobuf's JSON
  mapping with the proto field names (``{"Reset": {}}``, ``{"Sync": {}}``,
  ``{"Set": {"Ref": {"Set": "ServicesSet", "Path": "ns/name"}, "Bytes": B64}}``,
  ``{"Delete": {"Ref": ...}}``). Bytes are base64, so undecodable values survive
  a round trip, and unknown enum values are kept as numbers;
* ``{"disconnect": "REASON"}``: the stream failed here. Ops after the last Sync
  before it were a change set the brain never finished.

A change set is the ops up to and including a Sync; a recording of a healthy
stream starts with Reset and alternates change sets, one per WatchReq.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator

from google.protobuf import json_format

from kpng_py.api import localv1

FORMAT = "kpng-py-recording"
VERSION = 1


class RecordingError(ValueError):
    pass


@dataclass(frozen=True)
class Segment:
    """What a server sends for one WatchReq: ops, then maybe a stream failure."""

    ops: tuple[localv1.OpItem, ...]
    disconnect: str | None = None


class RecordingWriter:
    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._write({"format": FORMAT, "version": VERSION})

    def _write(self, obj: dict) -> None:
        self._out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def op(self, op: localv1.OpItem) -> None:
        self._write({"op": json_format.MessageToDict(op, preserving_proto_field_name=True)})

    def disconnect(self, reason: str) -> None:
        self._write({"disconnect": reason})
        self._out.flush()

    def flush(self) -> None:
        self._out.flush()


def read_lines(lines: Iterable[str], source: str) -> Iterator[localv1.OpItem | str]:
    """OpItems and disconnect reasons, in order, with errors naming the line."""
    header_seen = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise RecordingError(f"{where}: not JSON ({err.msg})") from err
        if not header_seen:
            if obj != {"format": FORMAT, "version": VERSION}:
                raise RecordingError(
                    f"{where}: expected the header {{\"format\": \"{FORMAT}\", \"version\": "
                    f"{VERSION}}}; is this a kpng-py recording?")
            header_seen = True
        elif isinstance(obj, dict) and set(obj) == {"op"}:
            try:
                yield json_format.ParseDict(obj["op"], localv1.OpItem())
            except json_format.ParseError as err:
                raise RecordingError(f"{where}: not an OpItem: {err}") from err
        elif isinstance(obj, dict) and set(obj) == {"disconnect"}:
            yield str(obj["disconnect"])
        else:
            raise RecordingError(f'{where}: expected {{"op": ...}} or {{"disconnect": ...}}')
    if not header_seen:
        raise RecordingError(f"{source}: empty, expected a kpng-py recording")


def read_segments(path: Path) -> list[Segment]:
    """A recording split into what a server sends per WatchReq."""
    segments: list[Segment] = []
    pending: list[localv1.OpItem] = []
    # Only a regular file: a FIFO would block, /dev/zero never end.
    if not stat.S_ISREG(path.stat().st_mode):
        raise RecordingError(f"{path}: not a regular file; give a recording written by "
                             "`kpng-py record`")
    with path.open(encoding="utf-8") as lines:
        for item in read_lines(lines, str(path)):
            if isinstance(item, str):
                segments.append(Segment(tuple(pending), disconnect=item))
                pending = []
                continue
            pending.append(item)
            if item.WhichOneof("Op") == "Sync":
                segments.append(Segment(tuple(pending)))
                pending = []
    if pending:
        raise RecordingError(f"{path}: the last {len(pending)} ops have no Sync or disconnect "
                             "after them")
    return segments
