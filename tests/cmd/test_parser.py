"""The command line's parser (kpng_py/cmd/parser.py): a parse error is one
line and the --help to read, exit code 2, with the closest flag or choice
and the command a misplaced flag belongs to; through every command of the
real command line, and on a parser of its own."""

from __future__ import annotations

import pytest

from kpng_py.cmd.parser import Parser
from tests.support.cli import all_commands, run


def test_a_parse_error_is_one_line_in_every_command(capsys: pytest.CaptureFixture) -> None:
    """As the README says: one `kpng-py: error: ...` line (and the --help to
    read), exit code 2, no usage; for the top level and every command, sink
    and tool."""
    for command in all_commands():
        code, out = run(capsys, *command, "--no-such-flag")
        error, hint = out.splitlines()
        assert code == 2 and error.startswith("kpng-py: error: "), (command, out)
        assert hint == f"run `{' '.join(('kpng-py',) + command)} --help` for the flags", out


@pytest.mark.parametrize("argv, message", [
    (["local", "--api", "x:1", "to-ebpf", "--cgroupp", "/x"],
     "unrecognized arguments: --cgroupp /x; did you mean --cgroup?"),
    (["file", "-i", "s.yaml", "to-local", "to-ebpf", "--bpfs-dir=/x"],
     "unrecognized arguments: --bpfs-dir=/x; did you mean --bpffs-dir?"),
    # Before the sink, a misspelt flag's value is not taken for the sink.
    (["local", "--api", "x:1", "--eror-delay", "1", "to-print"],
     "unrecognized arguments: --eror-delay; did you mean --error-delay?"),
    (["lcoal"], "invalid choice: 'lcoal' (choose from 'local', "),
    (["lcoal"], "; did you mean 'local'?"),
    (["local", "--api", "x:1", "to-ebpff"], "; did you mean 'to-ebpf'?"),
    (["ebpf", "dupm"], "; did you mean 'dump'?"),
    (["--log-format", "jsn", "version"], "; did you mean 'json'?"),
    (["file", "-i", "s.yaml", "to-local", "to-print", "--node-name", "a"],
     "--node-name is a flag of `kpng-py file to-local`: give it before to-print"),
    (["local", "to-print", "--api", "x:1"],
     "--api is a flag of `kpng-py local`: give it before to-print"),
])
def test_a_misspelt_or_misplaced_flag_or_command_gets_the_right_one(
        capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    code, out = run(capsys, *argv)
    assert code == 2 and message in out.splitlines()[0], out


def test_a_far_off_word_gets_no_suggestion(capsys: pytest.CaptureFixture) -> None:
    code, out = run(capsys, "version", "--bogus")
    assert code == 2 and out.splitlines()[0] == "kpng-py: error: unrecognized arguments: --bogus"


def _tool() -> Parser:
    """`tool [--delay S] [--verbose] run [--fast]`."""
    parser = Parser(prog="kpng-py tool")
    parser.add_argument("--delay", type=float)
    parser.add_argument("--verbose", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run").add_argument("--fast", action="store_true")
    return parser


@pytest.mark.parametrize("argv, delay", [
    (["--delay", "-1", "run"], -1.0),  # a negative number is a value, not a flag
    (["--del", "2", "run"], 2.0),  # a long flag may be abbreviated
    (["--delay=-.5", "--verbose", "run", "--fast"], -0.5),
])
def test_what_argparse_takes_is_taken(argv: list[str], delay: float) -> None:
    assert _tool().parse_args(argv).delay == delay


@pytest.mark.parametrize("argv, start, end", [
    (["--dealy", "2", "run"], "unrecognized arguments: --dealy", "; did you mean --delay?"),
    (["run", "--verbose"], "unrecognized arguments: --verbose",
     "; --verbose is a flag of `kpng-py tool`: give it before run"),
    (["rn"], "argument command: invalid choice: 'rn'", "; did you mean 'run'?"),
])
def test_an_error_names_the_fix_in_one_line_and_exits_2(
        capsys: pytest.CaptureFixture, argv: list[str], start: str, end: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        _tool().parse_args(argv)
    assert exit_.value.code == 2
    error, hint = capsys.readouterr().err.splitlines()
    assert error.startswith(f"kpng-py: error: {start}") and error.endswith(end), error
    assert hint.startswith("run `kpng-py tool") and hint.endswith(" --help` for the flags")
