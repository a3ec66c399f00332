"""The userspace backend's declaration: `kpng-py local ... to-userspace [flags]`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from backends.userspace.context import MARKER, ProxyConfig
from kpng_py.cmd.flag_types import byte_size, positive_duration
from kpng_py.dataplane.registry import BackendSpec
from kpng_py.metrics.metrics import Metrics
from kpng_py.metrics.service_counters import add_endpoint_counters_flag
from kpng_py.model import IPNetwork
from kpng_py.node.nodeport_addresses import add_nodeport_addresses_flag, parse_cidrs

if TYPE_CHECKING:
    from backends.userspace.backend import UserspaceBackend

# Linux's IFNAMSIZ less the terminating NUL.
_MAX_INTERFACE_NAME = 15


def _interface_name(text: str) -> str:
    if not text or len(text) > _MAX_INTERFACE_NAME or any(c in text for c in "/: \t\n"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an interface name: use 1 to {_MAX_INTERFACE_NAME} characters "
            "without '/', ':' or spaces (e.g. kpng-py0)")
    return text


def _attempts(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 16:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of attempts from 1 to 16")
    return int(text)


def _pipe_size(text: str) -> int:
    size = byte_size(text)
    if not 4096 <= size <= 64 << 20:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pipe size from 4K to 64M (e.g. 1M)")
    return size


def _cluster_cidrs(text: str) -> tuple[IPNetwork, ...]:
    try:
        return parse_cidrs(item.strip() for item in text.split(",") if item.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ProxyConfig()
    parser.add_argument("--interface", type=_interface_name, default=defaults.interface,
                        help="interface that holds the ClusterIPs: created if missing (a dummy "
                             "link, or a bridge with no ports where the kernel lacks the dummy "
                             f"driver) and marked as kpng-py's (alias {MARKER!r}); an existing "
                             "one is used only if it carries that mark (docs/userspace.md); "
                             "/32 and /128 addresses on it that no service uses are removed "
                             f"(default: {defaults.interface})")
    parser.add_argument("--udp-idle-timeout", type=positive_duration,
                        default=defaults.udp_idle_timeout,
                        help="seconds without traffic after which a UDP session ends "
                             f"(default: {defaults.udp_idle_timeout:g})")
    parser.add_argument("--tcp-connect-timeout", type=positive_duration,
                        default=defaults.tcp_connect_timeout,
                        help="seconds to wait for an endpoint to accept a connection before "
                             f"trying the next (default: {defaults.tcp_connect_timeout:g})")
    parser.add_argument("--tcp-connect-attempts", type=_attempts,
                        default=defaults.tcp_connect_attempts,
                        help="endpoints tried, in Maglev order, before a client connection is "
                             f"reset (default: {defaults.tcp_connect_attempts})")
    parser.add_argument("--tcp-pipe-size", type=_pipe_size, default=defaults.pipe_size,
                        help="capacity of each splice pipe, i.e. bytes moved per event-loop "
                             "wake-up, per connection and direction (default: 1M)")
    parser.add_argument("--cluster-cidr", type=_cluster_cidrs, default=defaults.cluster_cidrs,
                        metavar="CIDRS",
                        help="the pods' addresses, as kube-proxy's flag (comma-separated, "
                             "one per family or more): a client in them dialling a node port, "
                             "ExternalIP or LB IP is served like a client on the node, from "
                             "the cluster endpoints whatever externalTrafficPolicy says (N9); "
                             "without it a pod is served as a client from outside")
    add_nodeport_addresses_flag(parser)
    add_endpoint_counters_flag(parser)


def create(args: argparse.Namespace, metrics: Metrics) -> UserspaceBackend:
    from backends.userspace.backend import UserspaceBackend  # pyroute2: loaded only when used

    config = ProxyConfig(
        interface=args.interface,
        udp_idle_timeout=args.udp_idle_timeout,
        tcp_connect_timeout=args.tcp_connect_timeout,
        tcp_connect_attempts=args.tcp_connect_attempts,
        pipe_size=args.tcp_pipe_size,
        nodeport_addresses=args.nodeport_addresses,
        endpoint_counters=args.endpoint_counters,
        cluster_cidrs=args.cluster_cidr,
    )
    return UserspaceBackend(config, metrics)


BACKEND = BackendSpec(
    name="userspace",
    help="userspace proxy: each ClusterIP on a local interface, a TCP/UDP listener per "
         "ClusterIP:port, Maglev load balancing (no eBPF, no iptables)",
    add_arguments=add_arguments,
    create=create,
    tool=None,
)
