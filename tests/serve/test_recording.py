"""Recordings of Watch streams: what RecordingWriter writes is what
read_segments reads back, split per WatchReq, undecodable bytes and
disconnects included; anything else is refused naming the line."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

from kpng_py.api import localv1 as L
from kpng_py.serve.recording import RecordingError, RecordingWriter, Segment, read_segments
from tests.streams.build import delete, reset, set_raw, sync

HEADER = '{"format":"kpng-py-recording","version":1}\n'
UNDECODABLE = b"\xff\x00 not a Service"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_what_is_written_is_read_back_split_per_watch_request(tmp_path: Path) -> None:
    first = (reset(), set_raw(L.Set.ServicesSet, "default/web", UNDECODABLE), sync())
    cut = (delete(L.Set.ServicesSet, "default/web"),)
    out = io.StringIO()
    writer = RecordingWriter(out)
    for op in (*first, *cut):
        writer.op(op)
    writer.disconnect("UNAVAILABLE: brain stopped")
    writer.op(sync())
    writer.flush()
    segments = read_segments(write(tmp_path / "rec.jsonl", out.getvalue()))
    assert segments == [Segment(first), Segment(cut, disconnect="UNAVAILABLE: brain stopped"),
                        Segment((sync(),))]
    assert out.getvalue().startswith(HEADER)


@pytest.mark.parametrize("text, error", [
    ("", "rec.jsonl: empty, expected a kpng-py recording"),
    ('{"op": {"Sync": {}}}\n', "rec.jsonl:1: expected the header"),
    (HEADER + "\n{op}\n", "rec.jsonl:3: not JSON"),
    (HEADER + '{"op": {"Nope": {}}}\n', "rec.jsonl:2: not an OpItem"),
    (HEADER + '{"op": {"Sync": {}}, "disconnect": "x"}\n',
     'rec.jsonl:2: expected {"op": ...} or {"disconnect": ...}'),
    (HEADER + '{"op": {"Reset": {}}}\n', "the last 1 ops have no Sync or disconnect after them"),
])
def test_anything_but_a_recording_is_refused_naming_the_line(
        tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(RecordingError, match=re.escape(error)):
        read_segments(write(tmp_path / "rec.jsonl", text))


def test_a_fifo_is_refused_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "rec.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(RecordingError, match="not a regular file"):
        read_segments(fifo)
