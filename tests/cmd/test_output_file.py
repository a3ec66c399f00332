"""What `record -o` and `file convert -o` write to: a file that is not empty
is kept unless --force, and a recording is opened only at its first op."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kpng_py.cmd.output_file import OutputFile, OutputFileError
from kpng_py.cmd.runner import RecordSink
from kpng_py.serve.recording import Segment, read_segments
from tests.streams.build import reset, sync
from tests.support.process import Processes

RECORDING = '{"format": "kpng-py-recording", "version": 1}\n{"op": {"Reset": {}}}\n'


def test_a_file_that_is_not_empty_is_kept_unless_forced(tmp_path: Path) -> None:
    kept = tmp_path / "rec.jsonl"
    kept.write_text(RECORDING)
    with pytest.raises(OutputFileError, match=(
            f"^-o {kept}: exists and is not empty \\({len(RECORDING)} bytes\\); give --force to "
            "overwrite it, or another file$")):
        OutputFile(kept, "-o", force=False)
    assert kept.read_text() == RECORDING
    OutputFile(kept, "-o", force=True)  # refused no more, and not touched yet
    assert kept.read_text() == RECORDING


def test_an_empty_or_new_file_needs_no_force(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    OutputFile(empty, "-o", force=False).open().write("x")
    new = OutputFile(tmp_path / "new.jsonl", "-o", force=False)
    assert not new.path.exists()  # checked, not created


@pytest.mark.parametrize("name, problem", [
    ("missing/out.jsonl", "No such file or directory"),
    ("file/out.jsonl", "Not a directory"),
    (".", "is a directory"),
    ("fifo", "a FIFO that no process reads"),
])
def test_what_cannot_be_written_is_refused_at_start(tmp_path: Path, name: str,
                                                    problem: str) -> None:
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    path = tmp_path / name
    with pytest.raises(OutputFileError, match=f"^-o {path}: {problem}; give a file to write$"):
        OutputFile(path, "-o", force=True)


def test_a_recording_is_opened_at_its_first_op(tmp_path: Path) -> None:
    """A stream that fails before any op (a brain never reached) writes
    nothing: the file given with --force is left as it was until then."""
    kept = tmp_path / "rec.jsonl"
    kept.write_text(RECORDING)
    sink = RecordSink(OutputFile(kept, "-o", force=True))
    sink.on_stream_error("UNAVAILABLE: cannot reach the brain", [])
    sink.on_stream_error("UNAVAILABLE: cannot reach the brain", [])
    assert kept.read_text() == RECORDING
    sink.on_changeset([reset(), sync()])
    sink.on_stream_error("UNAVAILABLE: the brain is stopping", [])
    sink.close()
    assert read_segments(kept) == [Segment((reset(), sync())),
                                   Segment((), "UNAVAILABLE: the brain is stopping")]


def test_a_record_that_never_reaches_its_brain_keeps_the_file(tmp_path: Path) -> None:
    kept = tmp_path / "rec.jsonl"
    kept.write_text(RECORDING)
    with Processes(tmp_path) as processes:
        record = processes.start("record", "--api", f"unix://{tmp_path}/none.sock",
                                 "--error-delay", "0.05", "-o", str(kept), "--force")
        record.wait_for_log("watch stream to the brain failed", count=2)
        assert record.terminate() == 0
    assert kept.read_text() == RECORDING
