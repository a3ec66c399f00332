"""`kpng-py version`: the facts a bug report needs, each read, not assumed;
and the build version, which changes with every commit, in a checkout (git)
and in an image (recorded by its build, from what hack/image.sh passes)."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from pathlib import Path

import pytest

from kpng_py import __version__
from kpng_py.cmd.cli import main
from kpng_py.cmd.version import (
    SOURCE_DIR,
    Build,
    current_build,
    record,
    recorded_build,
    running,
    tree_build,
)
from tests.support.version import checkout_build

ROOT = SOURCE_DIR
# What Docker takes as a tag.
_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **_GIT_ENV}).stdout.strip()


def commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", f"write {name}")
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "tree"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "a.txt", "a\n")
    return repo


def test_version_reports_kpng_py_its_commit_python_the_kernel_and_bcc(
        capsys: pytest.CaptureFixture) -> None:
    assert main(["version", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    build = checkout_build(ROOT)
    assert (report["kpng-py"], report["commit"]) == (build.version, build.source)
    assert report["python"] == platform.python_version()
    assert report["kernel"] == platform.release()
    assert report["grpcio"][0].isdigit() and report["protobuf"][0].isdigit()
    head = git(ROOT, "rev-parse", "HEAD")
    assert head.startswith(report["commit"].removesuffix("-dirty"))
    commits = git(ROOT, "rev-list", "--count", "HEAD")
    assert report["kpng-py"].startswith(f"{__version__}+{commits}.g")
    bcc = pytest.importorskip("bcc.version", reason="BCC (python3-bpfcc) is not installed")
    assert report["bcc"] == bcc.__version__


def test_the_text_form_has_one_line_per_fact(capsys: pytest.CaptureFixture) -> None:
    assert main(["version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["kpng-py:", running()[0]]
    assert any(line.split()[:2] == ["kernel:", platform.release()] for line in lines)


def test_dash_dash_version_prints_the_build(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"kpng-py {running()[0]}\n"


def test_a_checkouts_version_changes_with_every_commit_and_marks_changes(repo: Path) -> None:
    first = checkout_build(repo)
    head = commit(repo, "b.txt", "b\n")
    second = checkout_build(repo)
    assert first == Build(__version__, 1, first.commit, dirty=False)
    assert second == Build(__version__, 2, head[:12], dirty=False)
    assert second.version == f"{__version__}+2.g{head[:12]}" != first.version
    assert second.source == head[:12]
    (repo / "b.txt").write_text("changed\n")
    assert tree_build(repo) == Build(__version__, 2, head[:12], dirty=True)
    git(repo, "checkout", "-q", "--", "b.txt")
    (repo / "new.txt").write_text("not added\n")  # an image build would copy it
    changed = checkout_build(repo)
    assert changed.dirty
    assert changed.version.endswith(".dirty") and changed.source.endswith("-dirty")


def test_only_the_top_of_a_checkout_has_a_tree_build(repo: Path, tmp_path: Path) -> None:
    """Installed inside someone else's repository, the package has no build
    of its own; nor has a folder that is no checkout."""
    (repo / "site-packages").mkdir()
    assert tree_build(repo / "site-packages") is None
    assert tree_build(tmp_path) is None


def test_an_image_tag_has_no_plus_and_keeps_the_build_apart(repo: Path) -> None:
    commit(repo, "b.txt", "b\n")
    build = checkout_build(repo)
    assert "+" in build.version and _IMAGE_TAG.fullmatch(build.image_tag)
    assert build.image_tag == build.version.replace("+", "-")
    dirty = Build(build.base, build.commits, build.commit, dirty=True)
    assert _IMAGE_TAG.fullmatch(dirty.image_tag) and dirty.image_tag != build.image_tag


def test_an_image_reads_the_version_its_build_recorded(repo: Path, tmp_path: Path) -> None:
    """No .git in the image: the file the Dockerfile's `--record` writes."""
    built = checkout_build(repo)
    path = tmp_path / "BUILD_VERSION"
    assert record(built.version, path) == built
    image_dir = tmp_path / "opt"  # the image's source folder: no checkout
    image_dir.mkdir()
    assert recorded_build(path) == built == current_build(image_dir, path)
    assert running(image_dir, path) == (built.version, built.source)
    assert current_build(repo, path) == built  # a checkout reads git first
    assert running(image_dir, tmp_path / "none") == (__version__, "unknown")


@pytest.mark.parametrize("text", ["0.1.0", "latest", "0.1.0-332.g87621f711c83",
                                  "0.1.0+332.g87621f711c8", "0.1.0+332.g87621f711c83.dirty.x"])
def test_a_malformed_version_is_refused_with_the_form_it_needs(text: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected BASE\\+COMMITS.gHASH"):
        record(text, tmp_path / "BUILD_VERSION")
    assert not (tmp_path / "BUILD_VERSION").exists()


def test_a_version_of_another_base_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"this tree is {re.escape(__version__)}"):
        record("9.9.9+1.g87621f711c83", tmp_path / "BUILD_VERSION")


def test_a_damaged_record_is_reported_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "BUILD_VERSION"
    path.write_text("garbage\n")
    version, source = running(tmp_path, path)
    assert version == __version__ and source.startswith(f"unknown ({path} is damaged: ")


def test_the_module_prints_a_checkouts_build_with_the_standard_library_alone() -> None:
    """hack/image.sh runs it with the host's python3, no venv."""
    build = checkout_build(ROOT)
    for args, expected in (([], build.version), (["--image-tag"], build.image_tag)):
        done = subprocess.run(["python3", "-E", "-s", "-m", "kpng_py.cmd.version", *args], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        assert done.stdout == expected + "\n"
