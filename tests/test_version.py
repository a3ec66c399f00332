"""`kpng-py version`: the facts a bug report needs, each read, not assumed."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest

from kpng_py import __version__
from kpng_py.cli import main
from kpng_py.version import SOURCE_DIR, source_commit


def test_version_reports_kpng_py_its_commit_python_the_kernel_and_bcc(
        capsys: pytest.CaptureFixture) -> None:
    assert main(["version", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kpng-py"] == __version__
    assert report["python"] == platform.python_version()
    assert report["kernel"] == platform.release()
    assert report["grpcio"][0].isdigit() and report["protobuf"][0].isdigit()
    head = subprocess.run(["git", "-C", str(SOURCE_DIR), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout
    assert head.startswith(report["commit"].removesuffix("-dirty"))
    bcc = pytest.importorskip("bcc.version", reason="BCC (python3-bpfcc) is not installed")
    assert report["bcc"] == bcc.__version__


def test_the_text_form_has_one_line_per_fact(capsys: pytest.CaptureFixture) -> None:
    assert main(["version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["kpng-py:", __version__]
    assert any(line.split()[:2] == ["kernel:", platform.release()] for line in lines)


def test_outside_a_checkout_the_commit_is_unknown(tmp_path: Path) -> None:
    assert source_commit(tmp_path) == "unknown"
