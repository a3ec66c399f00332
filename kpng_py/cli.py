"""The `kpng-py` command line. Mirrors KPNG's: a source of state, then a sink.

    kpng-py local  --api ADDR [--node-name N] to-<backend> [backend flags]
    kpng-py record --api ADDR [--node-name N] -o FILE
    kpng-py replay -i FILE to-api --listen unix:///path|tcp://host:port
    kpng-py file   -i STATE.yaml to-api --listen unix:///path|tcp://host:port
    kpng-py file   -i STATE.yaml to-local [--node-name N] to-<backend> [backend flags]
"""

from __future__ import annotations

import argparse
import importlib
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

from kpng_py import __version__, runner
from kpng_py.backend import BackendSetupError
from kpng_py.brain import command as brain_command
from kpng_py.brain.reader import StateFileError
from kpng_py.client import ClientConfig
from kpng_py.health import DEFAULT_HEALTHZ, DEFAULT_METRICS, BindAddress, Observability
from kpng_py.logs import setup_logging
from kpng_py.metrics import Metrics
from kpng_py.recording import RecordingError, read_segments
from kpng_py.replay import ReplaySource
from kpng_py.transport import AddressError, ListenAddress, TLSFiles, dial_target

# Backends by sink name. Each module has HELP, add_arguments(parser) and
# create(args, metrics) -> Backend, and imports its heavy dependencies lazily.
BACKENDS: dict[str, str] = {
    "to-print": "kpng_py.print_backend",
    "to-ebpf": "backends.ebpf.cli",
    "to-userspace": "backends.userspace.cli",
}


class UsageError(Exception):
    """A bad flag or value; the message names it and the fix."""


def _positive_float(text: str) -> float:
    try:
        value = float(text.rstrip("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration in seconds (e.g. 1 or 0.5)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    digits = text[:-1] if text[-1:].lower() in units else text
    if not digits.isdigit() or int(digits) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 4194304 or 4M)")
    return int(digits) * scale


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def _add_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (as KPNG's tlsflags)")
    group.add_argument("--tls-key", type=Path, help="TLS key file")
    group.add_argument("--tls-crt", type=Path, help="TLS certificate file")
    group.add_argument("--tls-ca", type=Path, help="TLS CA certificate file")


def _tls(args: argparse.Namespace) -> TLSFiles:
    return TLSFiles(args.tls_key, args.tls_crt, args.tls_ca)


def _add_node_name_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", default=socket.gethostname().lower(),
                        help="node whose view to watch (default: this host's name)")


def _add_exit_after_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exit-after", type=_count, default=0, metavar="N",
                        help="stop after N applied change sets (0: run until a signal); "
                             "for scripts and tests")


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", required=True,
                        help="the brain to watch: unix:///path/to.sock or host:port "
                             "(e.g. unix:///k8s/proxy.sock, 127.0.0.1:12090)")
    _add_node_name_flag(parser)
    parser.add_argument("--error-delay", type=_positive_float, default=1.0,
                        help="seconds before the first retry after an error; doubles up to "
                             "--max-error-delay (default: 1)")
    parser.add_argument("--max-error-delay", type=_positive_float, default=30.0,
                        help="cap on the retry delay in seconds (default: 30)")
    parser.add_argument("--max-msg-size", type=_size, default=4 << 20,
                        help="largest gRPC message accepted, in bytes (default: 4M)")
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


def add_observability_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("health and metrics (as kube-proxy)")
    group.add_argument("--healthz-bind-address", type=_bind_address("--healthz-bind-address"),
                       default=DEFAULT_HEALTHZ,
                       help=f"host:port for /healthz, empty to disable (default: {DEFAULT_HEALTHZ})")
    group.add_argument("--metrics-bind-address", type=_bind_address("--metrics-bind-address"),
                       default=DEFAULT_METRICS,
                       help=f"host:port for /metrics, empty to disable (default: {DEFAULT_METRICS})")
    group.add_argument("--healthz-timeout", type=_positive_float, default=60.0,
                       help="seconds a change set may be applying, or the brain be unreachable, "
                            "before /healthz answers 503 (default: 60)")


def observability(args: argparse.Namespace) -> Observability:
    return Observability(args.healthz_bind_address, args.metrics_bind_address,
                         args.healthz_timeout)


def _backend_module(sink: str) -> ModuleType:
    return importlib.import_module(BACKENDS[sink])


def add_backend_parsers(parser: argparse.ArgumentParser) -> None:
    sinks = parser.add_subparsers(dest="backend", metavar="to-<backend>", required=True,
                                  title="backends")
    for sink in BACKENDS:
        module = _backend_module(sink)
        sub = sinks.add_parser(sink, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)


def _server_address(args: argparse.Namespace) -> tuple[ListenAddress, TLSFiles]:
    """`to-api`'s --listen and TLS flags, checked."""
    listen, tls = ListenAddress.parse(args.listen), _tls(args)
    tls.check()
    return listen, tls


def _add_api_server_parser(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    sinks = parser.add_subparsers(dest="sink", metavar="to-api", required=True, title="sinks")
    api = sinks.add_parser("to-api", help="serve localv1 Watch streams to backends",
                           description="serve localv1 Watch streams to backends")
    api.add_argument("--listen", default="tcp://:12090",
                     help="unix:///path/to.sock or tcp://host:port (default: tcp://:12090)")
    _add_tls_flags(api)
    return sinks


def _add_file_parser(commands: argparse._SubParsersAction) -> None:
    brain = commands.add_parser(
        "file", help="be a brain: serve a KPNG state file, following its edits",
        description="Serve the state in a KPNG state file (`kpng file` format, "
                    "docs/brain.md) and publish each saved edit.")
    brain.add_argument("-i", "--input", type=Path, required=True, help="state file (YAML)")
    sinks = _add_api_server_parser(brain)
    sinks.metavar = "to-api|to-local"
    local = sinks.add_parser(
        "to-local", help="program a backend in this process (no gRPC)",
        description="Program a backend in this process with one node's view (no gRPC).")
    _add_node_name_flag(local)
    _add_exit_after_flag(local)
    add_observability_flags(local)
    add_backend_parsers(local)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kpng-py",
        description="A KPNG backend: programs a node's Kubernetes Services from a KPNG brain.")
    parser.add_argument("--version", action="version", version=f"kpng-py {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logs (-v debug, -vv also gRPC's)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="log line format on stderr (default: text)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    local = commands.add_parser(
        "local", help="watch a brain's localv1 API and program a backend",
        description="Watch a KPNG brain (`kpng ... to-api`) and program a backend.")
    _add_client_flags(local)
    add_observability_flags(local)
    add_backend_parsers(local)

    rec = commands.add_parser(
        "record", help="record a brain's localv1 stream to a file",
        description="Record the raw localv1 op stream (format: docs/recording-format.md).")
    _add_client_flags(rec)
    rec.add_argument("-o", "--output", type=Path, required=True, help="recording to write")

    replay = commands.add_parser(
        "replay", help="serve a recording as a brain would",
        description="Serve a recording: one recorded change set per WatchReq.")
    replay.add_argument("-i", "--input", type=Path, required=True, help="recording to serve")
    _add_api_server_parser(replay)
    _add_file_parser(commands)
    _backend_module("to-ebpf").add_tool_parser(commands)
    return parser


def _run(args: argparse.Namespace) -> None:
    metrics = Metrics()
    if args.command == "local":
        config = _client_config(args)
        backend = _backend_module(args.backend).create(args, metrics)
        runner.run_backend(config, backend, metrics, observability(args), args.exit_after)
    elif args.command == "record":
        runner.record(_client_config(args), args.output, metrics, args.exit_after)
    elif args.command == "replay":
        listen, tls = _server_address(args)  # flags first, then the file
        runner.serve(ReplaySource(read_segments(args.input)), listen, tls)
    elif args.command == "file":
        if args.sink == "to-api":
            brain_command.serve_file(args.input, *_server_address(args))
        else:
            backend = _backend_module(args.backend).create(args, metrics)
            brain_command.run_file_local(args.input, args.node_name, backend, metrics,
                                   observability(args), args.exit_after)
    elif args.command == "ebpf":
        _backend_module("to-ebpf").run_tool(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.verbose)
    try:
        _run(args)
    except (UsageError, AddressError, RecordingError, StateFileError, BackendSetupError) as err:
        print(f"kpng-py: error: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"kpng-py: error: {err.filename}: no such file", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
