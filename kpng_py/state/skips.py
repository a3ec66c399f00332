"""Counted, logged skips: how bad or unsupported input is reported.

Every object the state model cannot program gets exactly one log line (when it
is first seen in that form) and one increment of ``kpng_py_skipped_total`` with
its reason; processing carries on with everything else.
"""

from __future__ import annotations

import enum
import logging

from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.logs import fields

log = logging.getLogger("kpng_py.state.skips")


class SkipReason(str, enum.Enum):
    # Expected in a healthy cluster: nothing to program, logged at info level.
    HEADLESS = "headless"
    EXTERNAL_NAME = "external-name"
    UNSUPPORTED_PROTOCOL = "unsupported-protocol"
    # The same endpoint address and port sent twice (programmed once).
    DUPLICATE_ENDPOINT = "duplicate-endpoint"
    NO_CLUSTER_IP = "no-cluster-ip"
    # Bad input from the brain: logged as warnings.
    BAD_BYTES = "bad-bytes"
    BAD_PATH = "bad-path"
    UNKNOWN_SET = "unknown-set"
    UNKNOWN_DELETE = "unknown-delete"
    # Endpoints of a service the state does not have (from the brain, or an
    # EndpointSlice of a Service the API server does not have).
    UNKNOWN_SERVICE = "unknown-service"
    # What `kpng-py kube` cannot map of the API server's objects (the log
    # line says why).
    BAD_SERVICE = "bad-service"
    BAD_ENDPOINT_SLICE = "bad-endpointslice"
    BAD_NODE = "bad-node"
    BAD_IP = "bad-ip"
    # An address no service may claim as a frontend or an endpoint:
    # unspecified, loopback, link-local, multicast.
    SPECIAL_IP = "special-ip"
    BAD_PORT = "bad-port"
    DUPLICATE_PORT = "duplicate-port"
    UNRESOLVED_PORT = "unresolved-port"
    BAD_AFFINITY = "bad-affinity"
    # A frontend (address, port, protocol) already owned by another service
    # port: the first one programmed keeps it; this one waits for it.
    FRONTEND_CONFLICT = "frontend-conflict"
    # An object past a documented limit (the log line names the flag).
    LIMIT = "limit"
    # An OpItem that cannot be decoded (the rest of the stream is applied).
    BAD_OP = "bad-op"
    # The stream broke before the Sync of a change set: its ops were dropped
    # (the next stream's full state supersedes them).
    INCOMPLETE_CHANGESET = "incomplete-changeset"
    # A message larger than --max-msg-size: the stream fails (and is retried).
    OVERSIZED_MESSAGE = "oversized-message"
    # A change set whose ops exceed --max-changeset-size before its Sync: the
    # stream is dropped (and retried with backoff).
    OVERSIZED_CHANGESET = "oversized-changeset"
    # The dataplane could not hold the object (e.g. a full BPF map).
    CAPACITY = "capacity"


_EXPECTED = {SkipReason.HEADLESS, SkipReason.EXTERNAL_NAME, SkipReason.UNSUPPORTED_PROTOCOL,
             SkipReason.DUPLICATE_ENDPOINT}


class Skips:
    """Reports skipped objects to the log and the skip counter."""

    def __init__(self, metrics: Metrics) -> None:
        self._counter = metrics.skipped

    def skip(self, reason: SkipReason, obj: str, detail: str) -> None:
        level = logging.INFO if reason in _EXPECTED else logging.WARNING
        log.log(level, "skipped %s: %s", obj, detail,
                extra=fields(reason=reason.value, object=obj))
        self._counter.labels(reason.value).inc()

    def bad_source_range(self, owner: str, text: str) -> None:
        """A loadBalancerSourceRanges entry that is no CIDR (ServicePort.source_ranges)."""
        self.skip(SkipReason.BAD_IP, owner,
                  f"loadBalancerSourceRanges entry {text!r} is no CIDR: it allows nothing "
                  "(fix the service's spec.loadBalancerSourceRanges)")
