"""The eBPF backend's declaration: `to-ebpf` and `kpng-py ebpf cleanup|dump|trace`.

Nothing here imports BCC or libbpf at import time, so `kpng-py --help` works
on machines without them.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import signal
import sys
import threading
from pathlib import Path

from backends.ebpf.datapath.privileges import privilege_hint
from backends.ebpf.maps.layout import DEFAULT_PIN_DIR, SIZED_SPECS
from kpng_py.cmd.durations import DurationError, parse_seconds
from kpng_py.dataplane.contract import Backend, BackendSetupError
from kpng_py.dataplane.registry import BackendSpec, ToolCommand
from kpng_py.metrics.metrics import Metrics
from kpng_py.metrics.service_counters import add_endpoint_counters_flag
from kpng_py.node.nodeport_addresses import NodePortAddresses, add_nodeport_addresses_flag
from kpng_py.state.limits import positive_count


def _entries(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) < 1 << 32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of map entries "
                                         "(1 to 4294967295)")
    return int(text)


_SERVICE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?(:[-a-z0-9]+)?")


def _service_filter(text: str) -> str:
    if not _SERVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAMESPACE/NAME or "
                                         "NAMESPACE/NAME:PORT (e.g. default/web:http)")
    return text


_BRACKETED = re.compile(r"\[(?P<address>[^]]*)\](:(?P<port>.*))?")


def _vip_filter(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int | None]:
    """IP, IP:PORT, IPV6 or [IPV6]:PORT."""
    address, port = text, None
    if text.startswith("["):
        bracketed = _BRACKETED.fullmatch(text)
        address, port = (bracketed["address"], bracketed["port"]) if bracketed else ("", None)
    elif text.count(":") == 1:
        address, port = text.split(":")
    try:
        ip = ipaddress.ip_address(address)
        number = int(port) if port is not None else None
    except ValueError:
        number, ip = -1, None
    bracketed_v4 = text.startswith("[") and ip is not None and ip.version == 4
    if ip is None or bracketed_v4 or (number is not None and not 0 < number < 65536):
        raise argparse.ArgumentTypeError(f"{text!r} is not IP, IP:PORT or [IPV6]:PORT "
                                         "(e.g. 10.96.0.10:80)")
    return ip, number


def _add_bpffs_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bpffs-dir", type=Path, default=DEFAULT_PIN_DIR,
                        help=f"bpffs directory of the pinned maps and links "
                             f"(default: {DEFAULT_PIN_DIR})")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cgroup", type=Path, default=None,
                        help="cgroup v2 directory whose processes (and descendants') get the "
                             "services (default: the cgroup2 mount, i.e. the whole node)")
    _add_bpffs_dir_flag(parser)
    add_nodeport_addresses_flag(parser)
    parser.add_argument("--no-nodeport-netfilter", dest="nodeport_netfilter",
                        action="store_false",
                        help="do not program the nftables table `inet kpng-py` that serves "
                             "node ports, ExternalIPs and LB IPs to packets from outside the "
                             "node (default: programmed)")
    add_endpoint_counters_flag(parser)
    for spec in SIZED_SPECS:
        parser.add_argument(spec.size_flag, type=_entries, default=spec.default_size,
                            dest=f"map_size_{spec.pin}", metavar="ENTRIES",
                            help=f"capacity of the {spec.pin} map (default: {spec.default_size})")


def create(args: argparse.Namespace, metrics: Metrics) -> Backend:
    from backends.ebpf.backend import EbpfBackend
    from backends.ebpf.datapath.loader import DatapathConfig, default_cgroup
    from kpng_py.state.skips import Skips

    config = DatapathConfig(
        bpffs_dir=args.bpffs_dir,
        cgroup=args.cgroup or default_cgroup(),
        map_sizes={spec.pin: getattr(args, f"map_size_{spec.pin}") for spec in SIZED_SPECS},
        endpoint_counters=args.endpoint_counters)
    skips = Skips(metrics)
    netfilter = None
    if args.nodeport_netfilter:
        from backends.ebpf.netfilter.plan import NodePortMatch
        from backends.ebpf.netfilter.table import NetfilterTable

        every = args.nodeport_addresses == NodePortAddresses()
        netfilter = NetfilterTable(NodePortMatch.every_local() if every else NodePortMatch.only(()),
                                   skips, metrics.dataplane_errors.labels("udp-conntrack"))
    return EbpfBackend(config, metrics, skips, args.nodeport_addresses, netfilter=netfilter)


def _add_tool_arguments(tool: argparse.ArgumentParser) -> None:
    """`kpng-py ebpf cleanup|dump`."""
    actions = tool.add_subparsers(dest="ebpf_action", metavar="ACTION", required=True)
    cleanup = actions.add_parser(
        "cleanup", help="detach the programs and remove the pinned maps and links",
        description="Detach the programs and remove every pin under --bpffs-dir. Services "
                    "stop being translated at once.")
    cleanup.add_argument("--cgroup", type=Path, default=None,
                         help="also detach every kpng-py program attached to this cgroup, "
                              "whichever --bpffs-dir pins it")
    _add_bpffs_dir_flag(cleanup)
    cleanup.add_argument("--wait", type=_wait_seconds, default=0.0, metavar="DURATION",
                         help="while a running kpng-py owns the datapath, wait up to this "
                              "long for it to stop (seconds or Go's form, e.g. 10m; default: "
                              "0, refuse at once)")
    cleanup.add_argument("--force", action="store_true",
                         help="remove the datapath even while a running kpng-py owns it (that "
                              "process notices and puts it back within a second; stop it first "
                              "to remove it for good)")
    dump = actions.add_parser("dump", help="show the services, backends and map usage",
                              description="Show what the pinned maps hold. Exits 1, saying "
                                          "so, when --service or --vip match nothing.")
    _add_bpffs_dir_flag(dump)
    dump.add_argument("--json", action="store_true", help="print JSON")
    dump.add_argument("--service", type=_service_filter, metavar="NS/NAME[:PORT]",
                      help="only the frontends of this service (every port) or service port")
    dump.add_argument("--vip", type=_vip_filter, metavar="IP[:PORT]",
                      help="only the frontends a client reaches at this address (and port): "
                           "its ClusterIP, ExternalIP or LB IP ones, and the node ports if it "
                           "is a node-port address")
    trace = actions.add_parser(
        "trace", help="show every translation, live",
        description="Show every translation of the datapath as it happens (connect and "
                    "sendmsg: time, hook, protocol, VIP -> backend, service port, verdict, "
                    "the client's pid, command and cgroup), until Ctrl-C. The programs emit "
                    "events only while a trace is attached; one trace at a time.")
    _add_bpffs_dir_flag(trace)
    trace.add_argument("--service", type=_service_filter, metavar="NS/NAME[:PORT]",
                       help="only this service (every port) or service port")
    trace.add_argument("--vip", type=_vip_filter, metavar="IP[:PORT]",
                       help="only translations of this address (and port) as dialled")
    trace.add_argument("--pid", type=positive_count, default=0, help="only this client process")
    trace.add_argument("--json", action="store_true", help="print one JSON object per line")
    trace.add_argument("--count", type=positive_count, default=0,
                       help="exit after showing this many translations")


def _run_tool(args: argparse.Namespace) -> None:
    try:
        _run_action(args)
    except OSError as err:
        raise BackendSetupError(f"ebpf {args.ebpf_action}: {err}{privilege_hint(err)}") from err


def _run_action(args: argparse.Namespace) -> None:
    # The same checks as to-ebpf's: a cleanup of a path that escapes bpffs
    # through ".." or of a bpffs root would unlink what is not ours.
    from backends.ebpf.datapath.loader import checked_bpffs_dir, checked_cgroup

    bpffs_dir = checked_bpffs_dir(args.bpffs_dir)
    if args.ebpf_action == "cleanup":
        _cleanup(bpffs_dir, checked_cgroup(args.cgroup) if args.cgroup else None, args)
    elif args.ebpf_action == "trace":
        _trace(bpffs_dir, args)
    else:
        from backends.ebpf.netfilter.table import describe_lines, describe_table
        from backends.ebpf.tools.dump import dump_json, format_text, matching, read_dump

        dump = matching(read_dump(bpffs_dir), args.service, args.vip)
        if args.json:
            sys.stdout.write(dump_json({**dump, "netfilterTable": describe_table()}) + "\n")
        else:
            lines = [f"nftables {line}" for line in describe_lines()]
            sys.stdout.write("\n".join([format_text(dump), *lines]) + "\n")


def _cleanup(bpffs_dir: Path, cgroup: Path | None, args: argparse.Namespace) -> None:
    """`ebpf cleanup`, holding the datapath's lock (ownership.py) while it
    removes it: refused while a running kpng-py owns it, unless forced."""
    from backends.ebpf.datapath.loader import cleanup
    from backends.ebpf.datapath.ownership import DatapathInUse, DatapathLock, holder
    from backends.ebpf.netfilter.table import cleanup_table

    lock = DatapathLock.wait_for(bpffs_dir, args.wait) if bpffs_dir.is_dir() else None
    try:
        owners = _other_owners_on(bpffs_dir, cgroup)
        if lock is None and bpffs_dir.is_dir():
            owners[bpffs_dir] = holder(bpffs_dir)
        for directory, who in owners.items():
            if not args.force:
                waited = f", still after {args.wait:g} s" if args.wait else ""
                attached = "" if directory == bpffs_dir else f" (attached to --cgroup {cgroup})"
                raise DatapathInUse(
                    f"the datapath under {directory}{attached} is owned by a running kpng-py "
                    f"({who}){waited}: removing it would stop translating services under a "
                    "process that reports itself healthy. Stop that process first (e.g. "
                    "`kubectl delete -f deploy/kpng-py.yaml`), or pass --wait DURATION to wait "
                    "for it, or --force")
            print(f"forced: the datapath under {directory} is owned by a running kpng-py "
                  f"({who}), which will put it back", file=sys.stderr)
        removed = cleanup(bpffs_dir, cgroup)
        if cleanup_table():
            removed.append("the nftables table inet kpng-py")
    finally:
        if lock is not None:
            lock.release()
    print("\n".join(f"removed {item}" for item in removed) or
          f"nothing installed under {bpffs_dir}")


def _other_owners_on(bpffs_dir: Path, cgroup: Path | None) -> dict[Path, str]:
    """Datapaths pinned elsewhere on the same bpf filesystem, owned by a live
    process and attached to `cgroup`: `cleanup --cgroup` would detach them."""
    from backends.ebpf.datapath.loader import (
        LINKS_DIR,
        PROGRAMS_DIR,
        cgroup_id,
        mount_holding,
        pinned_links,
    )
    from backends.ebpf.datapath.ownership import owned_datapaths

    mount = mount_holding(bpffs_dir)
    if cgroup is None or mount is None:
        return {}
    target = cgroup_id(cgroup)
    return {directory: who for directory, who in owned_datapaths(
                mount.point, (LINKS_DIR, PROGRAMS_DIR)).items()
            if directory != bpffs_dir
            and any(link.cgroup_id == target for link in pinned_links(directory))}


def _wait_seconds(text: str) -> float:
    """A duration of 0 or more (seconds or Go's form)."""
    try:
        seconds = parse_seconds(text)
    except DurationError as err:
        raise argparse.ArgumentTypeError(str(err))
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is below 0 seconds")
    return seconds


def _trace(bpffs_dir: Path, args: argparse.Namespace) -> None:
    from backends.ebpf.tools.trace import TraceFilter, TraceSession

    vip, vip_port = args.vip or (None, None)
    wanted = TraceFilter(args.service, vip, vip_port, args.pid)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    shown = 0
    with TraceSession(bpffs_dir) as session:
        print(f"tracing the datapath under {bpffs_dir}; Ctrl-C to stop", file=sys.stderr,
              flush=True)
        try:
            for seen in session.translations(lambda: not stop.is_set()):
                if not wanted(seen):
                    continue
                print(seen.to_json() if args.json else seen.line(), flush=True)
                shown += 1
                if shown == args.count:
                    break
        except KeyboardInterrupt:
            pass
        lost = session.lost()
    if lost:
        print(f"{lost} translations were not traced: the ring buffer was full (this "
              "trace read more slowly than connections were made)", file=sys.stderr, flush=True)


def _versions() -> dict[str, str]:
    """BCC's version, or why it cannot be loaded (the backend needs it)."""
    try:
        from bcc.version import __version__ as bcc_version
    except Exception as err:  # ImportError, or OSError from loading libbcc
        return {"bcc": f"not loadable ({err})"}
    return {"bcc": bcc_version}


BACKEND = BackendSpec(
    name="ebpf",
    help="services (ClusterIPs, ExternalIPs, load-balancer IPs, node ports) for the processes "
         "of a cgroup, translated at the socket (cgroup sock_addr eBPF programs)",
    add_arguments=add_arguments,
    create=create,
    tool=ToolCommand(
        name="ebpf", help="inspect or remove the eBPF datapath",
        description="Inspect or remove the eBPF datapath.",
        add_arguments=_add_tool_arguments, run=_run_tool),
    versions=_versions,
)
