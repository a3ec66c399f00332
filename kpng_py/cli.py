"""The `kpng-py` command line. Mirrors KPNG's: a source of state, then a sink.

    kpng-py local  --api ADDR [--node-name N] to-<backend> [backend flags]
    kpng-py record --api ADDR [--node-name N] -o FILE
    kpng-py replay -i FILE to-api --listen unix:///path|tcp://host:port
"""

from __future__ import annotations

import argparse
import importlib
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence

from kpng_py import __version__
from kpng_py.client import ClientConfig
from kpng_py.logs import setup_logging
from kpng_py.metrics import Metrics
from kpng_py.recording import RecordingError
from kpng_py.transport import AddressError, ListenAddress, TLSFiles, dial_target

# Backends by sink name. Each module has HELP, add_arguments(parser) and
# create(args, metrics) -> Backend, and imports its heavy dependencies lazily.
BACKENDS: dict[str, str] = {
    "to-print": "kpng_py.print_backend",
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


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", required=True,
                        help="the brain to watch: unix:///path/to.sock or host:port "
                             "(e.g. unix:///k8s/proxy.sock, 127.0.0.1:12090)")
    parser.add_argument("--node-name", default=socket.gethostname().lower(),
                        help="node whose view to watch (default: this host's name)")
    parser.add_argument("--error-delay", type=_positive_float, default=1.0,
                        help="seconds before the first retry after an error; doubles up to "
                             "--max-error-delay (default: 1)")
    parser.add_argument("--max-error-delay", type=_positive_float, default=30.0,
                        help="cap on the retry delay in seconds (default: 30)")
    parser.add_argument("--max-msg-size", type=_size, default=4 << 20,
                        help="largest gRPC message accepted, in bytes (default: 4M)")
    parser.add_argument("--exit-after", type=_count, default=0, metavar="N",
                        help="stop after N applied change sets (0: run until a signal); "
                             "for scripts and tests")
    _add_tls_flags(parser)


def _client_config(args: argparse.Namespace) -> ClientConfig:
    if args.max_error_delay < args.error_delay:
        raise UsageError(f"--max-error-delay {args.max_error_delay} is below --error-delay "
                         f"{args.error_delay}; raise it or lower --error-delay")
    return ClientConfig(
        target=dial_target(args.api),
        node_name=args.node_name,
        tls=_tls(args),
        max_msg_size=args.max_msg_size,
        error_delay=args.error_delay,
        max_error_delay=args.max_error_delay,
    )


def _backend_module(sink: str) -> ModuleType:
    return importlib.import_module(BACKENDS[sink])


def add_backend_parsers(parser: argparse.ArgumentParser) -> None:
    sinks = parser.add_subparsers(dest="backend", metavar="to-<backend>", required=True,
                                  title="backends")
    for sink in BACKENDS:
        module = _backend_module(sink)
        sub = sinks.add_parser(sink, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)


def _add_api_server_parser(parser: argparse.ArgumentParser) -> None:
    sinks = parser.add_subparsers(dest="sink", metavar="to-api", required=True, title="sinks")
    api = sinks.add_parser("to-api", help="serve localv1 Watch streams to backends",
                           description="serve localv1 Watch streams to backends")
    api.add_argument("--listen", default="tcp://:12090",
                     help="unix:///path/to.sock or tcp://host:port (default: tcp://:12090)")
    _add_tls_flags(api)


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
    return parser


def _run(args: argparse.Namespace) -> None:
    # Imported here so `--help` stays fast and light.
    from kpng_py import runner

    metrics = Metrics()
    if args.command == "local":
        config = _client_config(args)
        backend = _backend_module(args.backend).create(args, metrics)
        runner.run_backend(config, backend, metrics, args.exit_after)
    elif args.command == "record":
        runner.record(_client_config(args), args.output, metrics, args.exit_after)
    elif args.command == "replay":
        from kpng_py.recording import read_segments
        from kpng_py.replay import ReplaySource

        source = ReplaySource(read_segments(args.input))
        runner.serve(source, ListenAddress.parse(args.listen), _tls(args))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.verbose)
    try:
        _run(args)
    except (UsageError, AddressError, RecordingError) as err:
        print(f"kpng-py: error: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"kpng-py: error: {err.filename}: no such file", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
