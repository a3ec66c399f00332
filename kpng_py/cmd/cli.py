"""The `kpng-py` command line. Mirrors KPNG's: a source of state, then a sink.

    kpng-py local  --api ADDR [--node-name N] to-<backend> [backend flags]
    kpng-py record --api ADDR [--node-name N] -o FILE [--force]
    kpng-py replay -i FILE to-api --listen unix:///path|tcp://host:port|host:port
    kpng-py file   -i STATE.yaml to-api --listen unix:///path|tcp://host:port|host:port
    kpng-py file   -i STATE.yaml to-local [--node-name N] to-<backend> [backend flags]
    kpng-py file   convert -i KUBECTL.yaml [-o STATE.yaml [--force]]
    kpng-py kube   [--kubeconfig PATH] [--server URL] to-api --listen ...
    kpng-py kube   [--kubeconfig PATH] [--server URL] to-local [--node-name N] to-<backend> ...

`-i -` is standard input.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

# The brain itself (its YAML reader and server) is imported by the commands
# that run it: a backend's run does not load it.
from kpng_py.brain.settings import (
    DEFAULT_MAX_FILE_SIZE,
    STDIN,
    Coalesce,
    KubeAccessError,
    Settle,
    StateFileError,
)
from kpng_py.cmd import runner
from kpng_py.cmd.flag_types import byte_size, positive_duration
from kpng_py.cmd.output_file import OutputFile, OutputFileError
from kpng_py.cmd.parser import PROGRAM, Parser
from kpng_py.cmd.version import PrintVersion, version_report
from kpng_py.dataplane import registry
from kpng_py.dataplane.contract import BackendSetupError, NothingMatched
from kpng_py.healthcheck.proxier_health import (
    DEFAULT_HEALTHZ,
    DEFAULT_METRICS,
    BindAddress,
    Observability,
)
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.logs import setup_logging
from kpng_py.serve.recording import RecordingError, read_segments
from kpng_py.serve.replay import ReplaySource
from kpng_py.state.limits import add_limit_flags, limits_from_args
from kpng_py.transport import ADDRESS_FORMS, AddressError, ListenAddress, TLSFiles, dial_target
from kpng_py.watch.client import ClientConfig, SinkFailed

if TYPE_CHECKING:
    from kpng_py.brain.kube.access import AccessFlags

_CLIENT = ClientConfig(target="", node_name="")  # the client's defaults


class UsageError(Exception):
    """A bad flag or value; the message names it and the fix."""


# grpcio takes message sizes as C ints.
MAX_MSG_SIZE = 2**31 - 1
# Kubernetes' limit on a node name (a DNS subdomain).
MAX_NODE_NAME = 253
# The shells `completion` writes for: shtab's (SUPPORTED_SHELLS, checked by
# tests/cmd/test_cli.py), named here so that a run does not import shtab.
COMPLETION_SHELLS = ("bash", "zsh", "tcsh", "fish", "powershell")





def _file_path(text: str) -> Path:
    """A path made absolute as the flags are read: BCC changes the process's
    working directory while it compiles, and files such as the state file and
    the TLS files are read again long after start-up."""
    return Path(text).absolute()


def _message_size(text: str) -> int:
    size = byte_size(text)
    if size > MAX_MSG_SIZE:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than gRPC's largest message size, {MAX_MSG_SIZE} bytes (2G - 1)")
    return size


def _count(text: str) -> int:
    if not text.isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def _node_name(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("is empty: give the node's name as the brain knows it")
    if len(text) > MAX_NODE_NAME or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} is not a node name (at most {MAX_NODE_NAME} printable characters)")
    return text


def _input_path(text: str) -> Path:
    """A file to read (made absolute as _file_path does), or STDIN (`-`, as
    it is named in messages) for `-`."""
    return STDIN if text == "-" else _file_path(text)


def _add_force_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true",
                        help="overwrite -o if it exists and is not empty (default: refuse)")


def _add_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (as KPNG's tlsflags)")
    group.add_argument("--tls-key", type=_file_path, help="TLS key file")
    group.add_argument("--tls-crt", type=_file_path, help="TLS certificate file")
    group.add_argument("--tls-ca", type=_file_path, help="TLS CA certificate file")


def _tls(args: argparse.Namespace) -> TLSFiles:
    return TLSFiles(args.tls_key, args.tls_crt, args.tls_ca)


def _add_node_name_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", type=_node_name, default=socket.gethostname().lower(),
                        help="node whose view to watch (default: this host's name)")


def _add_exit_after_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exit-after", type=_count, default=0, metavar="N",
                        help="stop after N applied change sets (0: run until a signal); "
                             "for scripts and tests")


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", required=True,
                        help=f"the brain to watch: {ADDRESS_FORMS}; gRPC's dns:///host:port too "
                             "(e.g. unix:///k8s/proxy.sock, 127.0.0.1:12090)")
    _add_node_name_flag(parser)
    parser.add_argument("--error-delay", type=positive_duration, default=_CLIENT.error_delay,
                        help="seconds before the first retry after an error; doubles up to "
                             "--max-error-delay, each delay up to a quarter longer at random "
                             "(default: 1)")
    parser.add_argument("--max-error-delay", type=positive_duration,
                        default=_CLIENT.max_error_delay,
                        help="cap on the retry delay in seconds; the delay starts again from "
                             "--error-delay once a stream stayed up this long (default: 30)")
    parser.add_argument("--max-msg-size", type=_message_size, default=_CLIENT.max_msg_size,
                        help="largest gRPC message accepted, in bytes (default: 4M, at most "
                             "2G - 1)")
    parser.add_argument("--max-changeset-size", type=byte_size, default=_CLIENT.max_changeset_size,
                        help="bytes of ops a change set may take before its Sync; beyond it the "
                             "stream is dropped and retried, which bounds the memory a brain "
                             "that never sends Sync can take (default: 256M)")
    parser.add_argument("--changeset-stall-timeout", type=positive_duration,
                        default=_CLIENT.changeset_stall_timeout,
                        help="seconds the brain may pause between two messages of one change "
                             "set before the stream is dropped and retried (default: 30)")
    parser.add_argument("--keepalive-time", type=positive_duration, default=_CLIENT.keepalive_time,
                        help="seconds between gRPC keepalive pings to the brain, also while "
                             "the stream is idle (default: 300: KPNG's brain, a grpc-go server "
                             "with default settings, closes connections that ping more often "
                             "than every 5 minutes while idle; kpng-py's own brain accepts "
                             "pings every second)")
    parser.add_argument("--keepalive-timeout", type=positive_duration,
                        default=_CLIENT.keepalive_timeout,
                        help="seconds to wait for a ping's answer before the stream is dropped "
                             "and retried (default: 20)")
    _add_exit_after_flag(parser)
    _add_tls_flags(parser)


def _client_config(args: argparse.Namespace) -> ClientConfig:
    if args.max_error_delay < args.error_delay:
        raise UsageError(f"--max-error-delay {args.max_error_delay} is below --error-delay "
                         f"{args.error_delay}; raise it or lower --error-delay")
    tls = _tls(args)
    tls.check()
    return ClientConfig(
        target=dial_target(args.api),
        node_name=args.node_name,
        tls=tls,
        max_msg_size=args.max_msg_size,
        error_delay=args.error_delay,
        max_error_delay=args.max_error_delay,
        keepalive_time=args.keepalive_time,
        keepalive_timeout=args.keepalive_timeout,
        changeset_stall_timeout=args.changeset_stall_timeout,
        max_changeset_size=args.max_changeset_size,
    )


def _bind_address(flag: str) -> Callable[[str], BindAddress | None]:
    def parse(text: str) -> BindAddress | None:
        if not text:
            return None
        try:
            return BindAddress.parse(text, flag)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err))
    return parse


def add_observability_flags(parser: argparse.ArgumentParser, healthz: str = DEFAULT_HEALTHZ,
                            metrics: str = DEFAULT_METRICS,
                            pending: str = "a change set may be applying, or the brain be "
                                           "unreachable") -> None:
    group = parser.add_argument_group("health and metrics (as kube-proxy)")
    for flag, default, path in (("--healthz-bind-address", healthz, "/healthz"),
                                ("--metrics-bind-address", metrics, "/metrics")):
        group.add_argument(flag, type=_bind_address(flag), default=_bind_address(flag)(default),
                           help=f"host:port for {path}, empty to disable (default: "
                                f"{default or 'off'})")
    group.add_argument("--healthz-timeout", type=positive_duration, default=60.0,
                       help=f"seconds {pending} before /healthz answers 503 (default: 60)")


def observability(args: argparse.Namespace) -> Observability:
    return Observability(args.healthz_bind_address, args.metrics_bind_address,
                         args.healthz_timeout)


def add_backend_parsers(parser: argparse.ArgumentParser) -> None:
    """A `to-<backend>` sink per registered backend (kpng_py.dataplane.registry)."""
    sinks = parser.add_subparsers(dest="backend", metavar="to-<backend>", required=True,
                                  title="backends")
    for spec in registry.registered():
        sub = sinks.add_parser(spec.sink, help=spec.help, description=spec.help)
        spec.add_arguments(sub)
        sub.set_defaults(create_backend=spec.create)


def _add_tool_parsers(commands: argparse._SubParsersAction) -> None:
    """The backends' own commands, such as `kpng-py ebpf dump`."""
    for tool in (spec.tool for spec in registry.registered() if spec.tool):
        sub = commands.add_parser(tool.name, help=tool.help, description=tool.description)
        tool.add_arguments(sub)
        sub.set_defaults(run_tool=tool.run)


def _server_address(args: argparse.Namespace) -> tuple[ListenAddress, TLSFiles]:
    """`to-api`'s --listen and TLS flags, checked."""
    listen, tls = ListenAddress.parse(args.listen), _tls(args)
    listen.check()
    tls.check()
    return listen, tls


def _add_api_server_parser(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    sinks = parser.add_subparsers(dest="sink", metavar="to-api", required=True, title="sinks")
    api = sinks.add_parser("to-api", help="serve localv1 Watch streams to backends",
                           description="serve localv1 Watch streams to backends")
    api.add_argument("--listen", default="tcp://:12090",
                     help=f"where to serve: {ADDRESS_FORMS}; no host, as in :12090, for "
                          "every address (e.g. unix:///run/kpng.sock, 127.0.0.1:12090; "
                          "default: tcp://:12090)")
    _add_tls_flags(api)
    return sinks


def _add_local_sink(sinks: argparse._SubParsersAction, pending: str) -> None:
    """A brain's `to-local` sink: `pending` says what turns /healthz 503."""
    local = sinks.add_parser(
        "to-local", help="program a backend in this process (no gRPC)",
        description="Program a backend in this process with one node's view (no gRPC).")
    _add_node_name_flag(local)
    _add_exit_after_flag(local)
    add_limit_flags(local)
    add_observability_flags(local, pending=pending)
    add_backend_parsers(local)


def _add_kube_parser(commands: argparse._SubParsersAction) -> None:
    brain = commands.add_parser(
        "kube", help="be a brain: watch a Kubernetes API server and serve each node's state",
        description="Watch the Services, EndpointSlices and Nodes of a Kubernetes API server "
                    "and serve each node's state, mapped as `file convert` maps them "
                    "(docs/brain.md). Without flags: $KUBECONFIG, or in a pod its service "
                    "account, or ~/.kube/config.")
    brain.add_argument("--kubeconfig", type=_file_path,
                       help="kubeconfig whose current context to use (default: in a pod, its "
                            "service account; else $KUBECONFIG or ~/.kube/config)")
    brain.add_argument("--server", help="the API server's URL (https://host:port); overrides "
                                        "the kubeconfig's")
    brain.add_argument("--token-file", type=_file_path,
                       help="bearer token file, read again at each request (a rotated "
                            "service-account token is followed); overrides the kubeconfig's")
    brain.add_argument("--certificate-authority", type=_file_path,
                       help="CA certificates (PEM) to trust the API server by; overrides the "
                            "kubeconfig's (default: the kubeconfig's, else the system's)")
    brain.add_argument("--settle", type=positive_duration, default=Coalesce().quiet,
                       help="seconds without a change before a burst of changes is served as "
                            "one new state (and at most ten times that after its first "
                            f"change; default: {Coalesce().quiet:g})")
    sinks = _add_api_server_parser(brain)
    sinks.metavar = "to-api|to-local"
    add_observability_flags(sinks.choices["to-api"], healthz="", metrics="",
                            pending="the API server may be unreachable")
    _add_local_sink(sinks, "a change set may be applying, or the API server be unreachable")


def _access_flags(args: argparse.Namespace) -> AccessFlags:
    from kpng_py.brain.kube.access import AccessFlags  # noqa: F811 (the brain, loaded here)

    return AccessFlags(args.kubeconfig, args.server, args.token_file, args.certificate_authority)


def _add_file_parser(commands: argparse._SubParsersAction) -> None:
    brain = commands.add_parser(
        "file", help="be a brain: serve a KPNG state file, following its edits",
        description="Serve the state in a KPNG state file (`kpng file` format, "
                    "docs/brain.md) and publish each saved edit.")
    brain.add_argument("-i", "--input", type=_input_path,
                       help="state file (YAML), followed as it is edited; - for standard input, "
                            "read once; required by to-api and to-local, and the input of "
                            "convert when its own -i is not given")
    brain.add_argument("--max-file-size", type=byte_size, default=DEFAULT_MAX_FILE_SIZE,
                       help="largest state file read, in bytes; a bigger one is refused "
                            f"(default: {DEFAULT_MAX_FILE_SIZE >> 20}M)")
    brain.add_argument("--settle", type=positive_duration, default=Settle().seconds,
                       help="seconds a new content of the file must stay the same (and "
                            "unmodified) before it is served, so that a save caught half-written "
                            "is not; a writer that only ever saves atomically (a temporary file "
                            f"renamed over it) may lower it (default: {Settle().seconds:g})")
    sinks = _add_api_server_parser(brain)
    sinks.metavar = "to-api|to-local|convert"
    _add_local_sink(sinks, "a change set may be applying, or the brain be unreachable")
    convert = sinks.add_parser(
        "convert", help="write a state file from `kubectl get nodes,svc,endpointslices -A -o yaml`",
        description="Write a KPNG state file from what `kubectl get nodes,svc,endpointslices -A "
                    "-o yaml` prints (kpng_py/brain/convert.py says how each object is mapped).")
    convert.add_argument("-i", "--input", type=_input_path, dest="kubectl_output",
                         help="kubectl's YAML output; - for standard input (default: file's -i)")
    convert.add_argument("-o", "--output", type=_file_path, help="state file to write, once "
                         "converted (default: stdout)")
    _add_force_flag(convert)


def _convert(args: argparse.Namespace) -> None:
    from kpng_py.brain.apiobjects import ObjectError
    from kpng_py.brain.convert import ConvertError
    from kpng_py.brain.convert import convert as convert_kubectl
    from kpng_py.brain.convert import dump as dump_state

    kubectl_output = _convert_input(args)
    # Checked before the input is read: a refusal costs no conversion.
    output = OutputFile(args.output, "-o", args.force) if args.output else None
    try:
        conversion = convert_kubectl(_read_input(kubectl_output).decode("utf-8"))
    except (ConvertError, ObjectError, UnicodeDecodeError) as err:
        raise UsageError(f"{kubectl_output}: {err}") from err
    text = dump_state(conversion)
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            with output.open() as out:
                out.write(text)
        except OSError as err:
            raise output.error(err) from err
    for kind, count in sorted(conversion.skipped.items()):
        print(f"kpng-py: skipped {count} object(s): {kind}", file=sys.stderr)


def _convert_input(args: argparse.Namespace) -> Path:
    """convert's -i, or file's (`file -i X convert`): one of them."""
    if args.kubectl_output and args.input and args.kubectl_output != args.input:
        raise UsageError(f"file -i {args.input} and convert -i {args.kubectl_output}: give "
                         "one -i (after file or after convert)")
    kubectl_output = args.kubectl_output or args.input
    if kubectl_output is None:
        raise UsageError("file convert needs -i FILE: kubectl's YAML output (- for standard "
                         "input)")
    return kubectl_output


def _read_input(path: Path) -> bytes:
    if path == STDIN:
        return sys.stdin.buffer.read()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise  # reported as every command reports a missing file
    except OSError as err:
        raise UsageError(f"-i {path}: {err.strerror}; give kubectl's YAML output") from err


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROGRAM,
        description="A KPNG backend: programs a node's Kubernetes Services from a KPNG brain.")
    parser.add_argument("--version", action=PrintVersion)
    _add_global_flags(parser, verbose=0, log_format="text")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    local = commands.add_parser(
        "local", help="watch a brain's localv1 API and program a backend",
        description="Watch a KPNG brain (`kpng ... to-api`) and program a backend.")
    _add_client_flags(local)
    add_limit_flags(local)
    add_observability_flags(local)
    add_backend_parsers(local)

    rec = commands.add_parser(
        "record", help="record a brain's localv1 stream to a file",
        description="Record the raw localv1 op stream (format: docs/recording-format.md).")
    _add_client_flags(rec)
    rec.add_argument("-o", "--output", type=_file_path, required=True,
                     help="recording to write, from the first op the brain sends (until then "
                          "an existing file is left as it is)")
    _add_force_flag(rec)

    replay = commands.add_parser(
        "replay", help="serve a recording as a brain would",
        description="Serve a recording: one recorded change set per WatchReq.")
    replay.add_argument("-i", "--input", type=_file_path, required=True, help="recording to serve")
    _add_api_server_parser(replay)
    _add_file_parser(commands)
    _add_kube_parser(commands)
    _add_tool_parsers(commands)
    version = commands.add_parser(
        "version", help="print the versions of kpng-py and of what it runs on",
        description="The versions of kpng-py (and its git commit), Python, the kernel, the "
                    "libraries and each backend's own dependencies (BCC), for bug reports.")
    version.add_argument("--json", action="store_true", help="one JSON object")
    completion = commands.add_parser(
        "completion", help="print a shell completion script",
        description="Print a completion script for the shell: e.g. "
                    "`kpng-py completion bash > /etc/bash_completion.d/kpng-py`.")
    completion.add_argument("shell", choices=COMPLETION_SHELLS)
    for sub in _subparsers(parser):
        # As KPNG's global flags: accepted after any command or sink too
        # (`local --api=... to-ebpf -v`); a command's own use wins.
        _add_global_flags(sub, verbose=argparse.SUPPRESS, log_format=argparse.SUPPRESS)
    return parser


def _add_global_flags(parser: argparse.ArgumentParser, verbose: object,
                      log_format: object) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=verbose,
                        help="more logs (-v debug, -vv also gRPC's)")
    parser.add_argument("--log-format", choices=("text", "json"), default=log_format,
                        help="log line format on stderr (default: text)")


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every command, sink and tool action below `parser`."""
    for action in parser._actions:  # argparse has no public walk of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _subparsers(sub)


def _print_versions(as_json: bool) -> None:
    report = version_report(registry.registered())
    if as_json:
        print(json.dumps(report))
    else:
        width = max(map(len, report))
        print("\n".join(f"{name + ':':<{width + 1}} {value}" for name, value in report.items()))


def _run(args: argparse.Namespace) -> None:
    metrics = Metrics()
    if args.command == "local":
        config = _client_config(args)
        backend = args.create_backend(args, metrics)
        runner.run_backend(config, backend, metrics, observability(args), args.exit_after,
                           limits_from_args(args))
    elif args.command == "record":
        config = _client_config(args)  # flags first, then the file
        runner.record(config, OutputFile(args.output, "-o", args.force), metrics,
                      args.exit_after)
    elif args.command == "replay":
        listen, tls = _server_address(args)  # flags first, then the file
        runner.serve(ReplaySource(read_segments(args.input)), listen, tls)
    elif args.command == "file":
        if args.sink == "convert":
            _convert(args)
            return
        if args.input is None:
            raise UsageError(f"file {args.sink} needs -i STATE.yaml (before {args.sink})")
        from kpng_py.cmd import file as file_command

        if args.sink == "to-api":
            file_command.serve_file(args.input, *_server_address(args), args.max_file_size,
                                    Settle.after(args.settle))
        else:
            backend = args.create_backend(args, metrics)
            file_command.run_file_local(args.input, args.node_name, backend, metrics,
                                         observability(args), args.exit_after,
                                        args.max_file_size, limits_from_args(args),
                                         Settle.after(args.settle))
    elif args.command == "kube":
        from kpng_py.cmd import kube as kube_command

        coalesce = Coalesce.after(args.settle)
        if args.sink == "to-api":
            kube_command.serve_kube(_access_flags(args), *_server_address(args), metrics,
                                    observability(args), coalesce)
        else:
            backend = args.create_backend(args, metrics)
            kube_command.run_kube_local(_access_flags(args), args.node_name, backend, metrics,
                                        observability(args), args.exit_after,
                                        limits_from_args(args), coalesce)
    elif args.command == "version":
        _print_versions(args.json)
    elif args.command == "completion":
        import shtab  # only here: the parser of every run names its shells

        print(shtab.complete(build_parser(), shell=args.shell))
    else:
        args.run_tool(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.verbose)
    try:
        _run(args)
    except (UsageError, AddressError, RecordingError, StateFileError, BackendSetupError,
            OutputFileError, KubeAccessError) as err:
        print(f"kpng-py: error: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"kpng-py: error: {err.filename}: no such file", file=sys.stderr)
        return 2
    except (SinkFailed, NothingMatched) as err:
        print(f"kpng-py: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
