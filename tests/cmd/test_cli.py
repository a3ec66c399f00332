"""The command line: help everywhere, and errors that name the flag and the fix."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import shtab

from kpng_py.cmd.cli import COMPLETION_SHELLS, build_parser, main
from tests.support.cli import all_commands, run


@pytest.fixture(autouse=True)
def _restore_logging():
    """main() points the root logger at this test's captured stderr; later
    tests must not log into a closed stream (nor at its level)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_help_on_every_command(capsys: pytest.CaptureFixture) -> None:
    commands = list(all_commands())
    assert ("local", "to-print") in commands and ("replay", "to-api") in commands
    for command in commands:
        code, out = run(capsys, *command, "--help")
        assert code == 0 and "usage: kpng-py" in out, command


@pytest.mark.parametrize("argv, message", [
    (["local", "--api", "unix://rel.sock", "to-print"], "--api 'unix://rel.sock': use unix:///absolute/path"),
    (["local", "--api", "http://x:1", "to-print"], "--api 'http://x:1': unknown scheme http://"),
    (["local", "--api", "x:1", "--error-delay", "-1", "to-print"],
     "--error-delay: '-1' must be more than 0"),
    (["local", "--api", "x:1", "--max-msg-size", "lots", "to-print"],
     "--max-msg-size: 'lots' is not a size"),
    (["local", "--api", "x:1", "--error-delay", "5", "--max-error-delay", "2", "to-print"],
     "--max-error-delay 2.0 is below --error-delay 5.0"),
    (["local", "--api", "x:1", "--tls-key", "k.pem", "to-print"],
     "--tls-key and --tls-crt go together"),
    (["local", "--api", "x:1", "to-nowhere"], "invalid choice: 'to-nowhere'"),
    (["replay", "-i", "/nonexistent.jsonl", "to-api"], "/nonexistent.jsonl: no such file"),
    (["replay", "-i", "x.jsonl", "to-api", "--listen", "http://x"],
     "use unix:///path/to.sock, tcp://host:port or host:port"),
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


# Hostile values for every flag of every command (the backends' own flags are
# their modules' tests). Placeholders: {dir} a directory, {fifo} a FIFO nobody
# writes or reads, {missing} a path that does not exist, {text} a file that is
# not what the flag wants, {busy} a TCP port something listens on.
DURATIONS = ["", "x", "-1", "0", "nan", "inf", "-inf", "1e400", "1e12"]
CLIENT_DURATIONS = ["--error-delay", "--max-error-delay", "--keepalive-time",
                    "--keepalive-timeout", "--changeset-stall-timeout"]
COUNTS = ["", "x", "-1", "1.5", "nan", "\u00b2"]
SIZES = ["", "x", "0", "-1", "1.5M", "nan", "4T", "\u00b2"]
LIMITS = ["--max-service-ports", "--max-service-endpoints", "--max-endpoints"]
FILES = ["{dir}", "{fifo}", "{missing}", "/dev/zero", "{text}"]
LOCAL = ["local", "--api", "unix:///nonexistent.sock"]
TO_LOCAL = ["file", "-i", "{missing}", "to-local"]
REPLAY = ["replay", "-i", "{missing}", "to-api"]
HOSTILE = [
    *[(LOCAL[:1], ["--api", api], ["to-print"])
      for api in ["", " ", "unix://rel.sock", "tcp://", "tcp://:1", "tcp://h:99999", "a\nb"]],
    *[(LOCAL, [flag, value], ["to-print"]) for flag in CLIENT_DURATIONS for value in DURATIONS],
    *[(LOCAL, ["--healthz-timeout", value], ["to-print"]) for value in DURATIONS],
    *[(LOCAL, ["--max-msg-size", value], ["to-print"]) for value in SIZES + ["3G", "2G"]],
    *[(LOCAL, ["--max-changeset-size", value], ["to-print"]) for value in SIZES[:-2]],
    *[(LOCAL, ["--exit-after", value], ["to-print"]) for value in COUNTS],
    *[(LOCAL, [flag, value], ["to-print"]) for flag in LIMITS for value in COUNTS + ["0"]],
    *[(LOCAL, ["--node-name", value], ["to-print"]) for value in ["", "x" * 300, "a\nb"]],
    *[(LOCAL, [flag, value], ["to-print"])
      for flag in ["--healthz-bind-address", "--metrics-bind-address"]
      for value in ["x", ":99999", "1.2.3.4", "::::"]],
    *[(LOCAL, ["--tls-ca", value], ["to-print"]) for value in FILES],
    *[(LOCAL, ["--tls-key", value, "--tls-crt", "{pem}"], ["to-print"]) for value in FILES],
    *[(["record", "--api", "unix:///nonexistent.sock"], ["-o", value], [])
      for value in ["{dir}", "{fifo}", "{missing}/out.jsonl", "{text}/out.jsonl", "{text}"]],
    *[(["file", "convert", "-i", "{text}"], ["-o", value], [])
      for value in ["{dir}", "{fifo}", "{missing}/state.yaml", "{text}/state.yaml", "{text}"]],
    *[(["replay"], ["-i", value], ["to-api", "--listen", "unix:///{dir}/s.sock"])
      for value in FILES[:-1]],
    *[(REPLAY, ["--listen", value], [])
      for value in ["", "x", "unix://rel", "unix:///", "unix:///" + "x" * 120, "tcp://",
                    "tcp://:99999", "tcp://:-1", "tcp://192.0.2.1:1", "tcp://{busy}",
                    "tcp://nosuch.invalid:1"]],
    *[(REPLAY, ["--tls-ca", value], []) for value in FILES],
    *[(["file"], ["-i", value], ["to-api", "--listen", "unix:///{dir}/s.sock"])
      for value in FILES[:-1]],
    *[(["file", "-i", "{missing}"], ["--max-file-size", value], ["to-api"]) for value in SIZES],
    *[(["file", "-i", "{missing}"], ["--settle", value], ["to-api"]) for value in DURATIONS],
    *[(TO_LOCAL, ["--node-name", value], ["to-print"]) for value in ["", "x" * 300]],
    *[(TO_LOCAL, ["--exit-after", value], ["to-print"]) for value in COUNTS],
    *[(TO_LOCAL, [flag, "0"], ["to-print"]) for flag in LIMITS],
    *[(TO_LOCAL, ["--healthz-timeout", value], ["to-print"]) for value in DURATIONS],
    ([], ["--log-format", "xml"], ["local"]),
]


@pytest.fixture
def hostile_paths(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    text = tmp_path / "text"
    text.write_text("not what any flag wants\n")
    pem = tmp_path / "pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield {"dir": str(tmp_path), "fifo": str(fifo), "missing": str(tmp_path / "missing"),
               "text": str(text), "pem": str(pem), "busy": "127.0.0.1:%d" % busy.getsockname()[1]}


@pytest.mark.parametrize("command, flag, rest", HOSTILE,
                         ids=[" ".join(c + f + r) for c, f, r in HOSTILE])
def test_a_hostile_value_is_one_clear_error(capsys: pytest.CaptureFixture, hostile_paths,
                                            command, flag, rest) -> None:
    """Exit code 2, one error line naming the flag (or, for -i and -o, the
    path given), and no traceback."""
    argv = [arg.format(**hostile_paths) for arg in command + flag + rest]
    code, out = run(capsys, *argv)
    errors = [line for line in out.splitlines() if "error:" in line]
    name, value = flag[0], flag[1].format(**hostile_paths)
    assert code == 2, out
    assert "Traceback" not in out and "usage:" not in out
    assert len(errors) == 1 and "unrecognized arguments" not in errors[0], out
    given_file = name in ("-i", "-o") and value in errors[0]
    assert name in errors[0] or given_file, out


def test_durations_in_go_form_are_taken_as_kpng_takes_them() -> None:
    args = build_parser().parse_args(
        ["local", "--api", "x:1", "--error-delay", "500ms", "--max-error-delay", "1m30s",
         "--keepalive-time", "5m", "--changeset-stall-timeout", "30", "to-print"])
    assert (args.error_delay, args.max_error_delay, args.keepalive_time,
            args.changeset_stall_timeout) == (0.5, 90.0, 300.0, 30.0)


def test_file_flags_do_not_depend_on_the_working_directory_after_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BCC changes the working directory while it compiles: a relative -i or
    TLS file must still name the same file afterwards."""
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(
        ["file", "-i", "state.yaml", "to-api", "--listen", "unix:///x", "--tls-ca", "ca.pem"])
    replay = build_parser().parse_args(["replay", "-i", "rec.jsonl", "to-api"])
    monkeypatch.chdir("/")
    assert args.input == tmp_path / "state.yaml" and args.tls_ca == tmp_path / "ca.pem"
    assert replay.input == tmp_path / "rec.jsonl"


def test_global_flags_are_taken_after_the_command_and_the_sink_too() -> None:
    args = build_parser().parse_args(
        ["local", "--api=x:1", "--log-format", "json", "to-print", "-v"])
    assert (args.verbose, args.log_format) == (1, "json")
    defaults = build_parser().parse_args(["local", "--api=x:1", "to-print"])
    assert (defaults.verbose, defaults.log_format) == (0, "text")


def complete(script: Path, words: list[str]) -> list[str]:
    """What bash completes for the last word of `words` with `script` sourced."""
    line = " ".join(words)
    program = (f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; '
               f'COMP_LINE="{line}"; COMP_POINT={len(line)}; '
               f'_shtab_kpng_py kpng-py {words[-1]} {words[-2]}; echo "${{COMPREPLY[@]}}"')
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_a_backend_run_loads_neither_the_brain_nor_shtab() -> None:
    """The parser of every command, and what `local ... to-ebpf` imports:
    the brain's YAML reader and server and the completion writer stay out."""
    program = ("import sys, kpng_py.cmd.cli, backends.ebpf.backend; "
               "kpng_py.cmd.cli.build_parser(); "
               "print(sorted(m for m in sys.modules if m in ('yaml', 'shtab') "
               "or m.startswith('kpng_py.brain.') and m != 'kpng_py.brain.settings'))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_completion_offers_the_shells_shtab_writes_for() -> None:
    assert COMPLETION_SHELLS == tuple(shtab.SUPPORTED_SHELLS)


def test_bash_completion_knows_the_commands_sinks_and_flags(
        capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "kpng-py.bash"
    script.write_text(capsys.readouterr().out)
    assert complete(script, ["kpng-py", "ver"]) == ["version"]
    assert set(complete(script, ["kpng-py", "local", "--api", "x", "to-"])) >= {
        "to-ebpf", "to-userspace", "to-print"}
    assert "--keepalive-time" in complete(script, ["kpng-py", "local", "--keep"])
