"""The command line: help everywhere, and errors that name the flag and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kpng_py.cli import build_parser, main


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def all_commands(parser=None, prefix=()):
    parser = parser or build_parser()
    yield prefix
    for action in parser._actions:  # argparse has no public walk of subcommands
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                yield from all_commands(sub, prefix + (name,))


def test_help_on_every_command(capsys: pytest.CaptureFixture) -> None:
    commands = list(all_commands())
    assert ("local", "to-print") in commands and ("replay", "to-api") in commands
    for command in commands:
        code, out = run(capsys, *command, "--help")
        assert code == 0 and "usage: kpng-py" in out, command


@pytest.mark.parametrize("argv, message", [
    (["local", "--api", "unix://rel.sock", "to-print"], "--api 'unix://rel.sock': use unix:///absolute/path"),
    (["local", "--api", "x:1", "--error-delay", "-1", "to-print"], "--error-delay: '-1' must be more than 0"),
    (["local", "--api", "x:1", "--max-msg-size", "lots", "to-print"], "--max-msg-size: 'lots' is not a size"),
    (["local", "--api", "x:1", "--error-delay", "5", "--max-error-delay", "2", "to-print"],
     "--max-error-delay 2.0 is below --error-delay 5.0"),
    (["local", "--api", "x:1", "--tls-key", "k.pem", "to-print"], "--tls-key and --tls-crt go together"),
    (["local", "--api", "x:1", "to-nowhere"], "invalid choice: 'to-nowhere'"),
    (["replay", "-i", "/nonexistent.jsonl", "to-api"], "/nonexistent.jsonl: no such file"),
    (["replay", "-i", "x.jsonl", "to-api", "--listen", "http://x"],
     "use unix:///path/to.sock or tcp://host:port"),
])
def test_bad_flags_are_named(capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    code, out = run(capsys, *argv)
    assert code == 2
    assert message in out


def test_a_file_that_is_not_a_recording(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    bad = tmp_path / "state.yaml"
    bad.write_text("services: []\n")
    code, out = run(capsys, "replay", "-i", str(bad), "to-api", "--listen", f"unix://{tmp_path}/s")
    assert code == 2 and f"{bad}:1: not JSON" in out

    bad.write_text('{"format": "kpng-py-recording", "version": 1}\n{"op": {"Nope": {}}}\n')
    code, out = run(capsys, "replay", "-i", str(bad), "to-api", "--listen", f"unix://{tmp_path}/s")
    assert code == 2 and f"{bad}:2: not an OpItem" in out
