"""Bounds on the work and memory the node state may take.

What a node state costs is its service ports times their endpoint addresses,
and the brain decides both. Each bound is checked before the work it bounds is
done; an object beyond one is refused with one `limit` skip naming the flag,
and its previous version (if any) stays in force, as for an undecodable one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

# Kubernetes' own limit on the addresses of one EndpointSlice endpoint; a brain
# that sends more is broken, so this is not a flag.
MAX_ENDPOINT_IPS = 100


@dataclass(frozen=True)
class Limits:
    """The configurable bounds (flags of `local` and `file ... to-local`)."""

    # Kubernetes sets no limit on a Service's ports, so this is a flag: a
    # cluster that needs more can raise it. 1000 is far above real services
    # and keeps one object's frontends within what a dataplane can hold.
    max_service_ports: int = 1000
    # Service ports x endpoint addresses of one service (100 000 is 100 ports
    # of 1000 pods, or 1 port of 100 000).
    max_service_endpoints: int = 100_000
    # Resolved endpoints held for the whole node. Each costs at most about
    # 850 bytes with what it came from (measured, one port per endpoint), so
    # this bounds the state to under 2 GB.
    max_endpoints: int = 2_000_000


_DEFAULTS = Limits()


def positive_count(text: str) -> int:
    """An argparse type: a whole number above 0."""
    if not text.isdecimal() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return int(text)


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("limits on the brain's state")
    group.add_argument(
        "--max-service-ports", type=positive_count, default=_DEFAULTS.max_service_ports,
        metavar="N",
        help="ports one service may have (default: %(default)s); a service with more is "
             "refused and its previous version stays in force")
    group.add_argument(
        "--max-service-endpoints", type=positive_count,
        default=_DEFAULTS.max_service_endpoints, metavar="N",
        help="ports x endpoint addresses of one service (default: %(default)s); a service "
             "over it is refused whole and its previous version stays in force")
    group.add_argument(
        "--max-endpoints", type=positive_count, default=_DEFAULTS.max_endpoints, metavar="N",
        help="resolved endpoints of all services of the node (default: %(default)s); a "
             "service whose new version would go over it is refused (its previous version "
             "stays in force) until others make room")


def limits_from_args(args: argparse.Namespace) -> Limits:
    return Limits(max_service_ports=args.max_service_ports,
                  max_service_endpoints=args.max_service_endpoints,
                  max_endpoints=args.max_endpoints)
