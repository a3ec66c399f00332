"""The watch client: one localv1 Watch stream to a brain, kept up forever.

It sends WatchReq, hands the ops of the change set to its sink as they
arrive (in batches of `staged_batch`, so that a full state of 100 000 ops is
never held as one list of messages) and the last of them with the Sync, and
only then asks for the next one. On any stream or connection error it
reconnects with backoff (first retry after `error_delay`, doubling up to
`max_error_delay`, each stretched by up to a quarter at random); the new stream
starts with Reset and the full state, which `NodeState` turns into real
differences only.

What a brain can send is bounded here, before anything is decoded further:
each message is decoded on its own (an undecodable one is one `bad-op` skip,
the stream goes on); a change set must keep making progress once it started
(`changeset_stall_timeout` between two of its messages) and stay within
`max_changeset_size` bytes, or the stream is dropped and retried with backoff;
HTTP/2 keepalive pings notice a brain that stopped answering at all (a
SIGSTOPped process, a dead peer behind a live connection). A first message
sent very slowly cannot be told from a quiet brain: a change set starts when
its first message is complete.

The transport is grpclib, asyncio on h2 (kpng_py/watch/grpclib_watch.py; grpcio's
client took 2.6 to 3.9 times its CPU per one-op message, docs/bench.md
"Transport"). `run` runs the stream's event loop in the calling thread, and
the sink on one worker thread of its own, always the same, while the loop
awaits it. So an apply that takes seconds never stops the loop: h2 PINGs are
answered, keepalive pings sent and their answers timed, a lost connection and
`stop()` noticed; and the sink runs where no event loop is running (pyroute2
runs one of its own in every call). Credit is unchanged: the next WatchReq is
sent only once the sink returned. Only the ops handed over before their Sync
(`on_ops`) are given on the loop's own thread: taking them into a state is
short and waits for nothing, and handing them to another thread while the
loop went on receiving cost about a tenth more CPU than holding them all
until the Sync, where the loop's thread costs nothing more (two threads
taking turns at the interpreter on two cores; docs/bench.md "Transport").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Protocol, TypeVar

from google.protobuf.message import DecodeError

from kpng_py.api import localv1
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.aio import ThreadsafeEvent, new_event_loop
from kpng_py.runtime.backoff import Backoff
from kpng_py.runtime.logs import fields
from kpng_py.state.skips import SkipReason, Skips
from kpng_py.transport import AddressError, TLSFiles
from kpng_py.watch.grpclib_watch import CallFailed, WatchCall, open_channel

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class SinkFailed(Exception):
    """Raised by a sink that cannot go on (its output is gone): the watch
    ends and `WatchClient.run` raises it. Any other exception of a sink is
    taken for a bug downstream, and the client resyncs."""


class ChangeSetSink(Protocol):
    """What takes a change set with its Sync, or is told it failed."""

    def on_changeset_started(self) -> None:
        """The first message of a change set arrived (its Sync has not)."""

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        """The change set's ops not handed over yet, ending with its Sync."""

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        """The stream failed; `partial` holds the ops received after the last
        Sync that were not handed over yet. The change set is never complete."""


class OpsSink(ChangeSetSink, Protocol):
    """What the watch client feeds: ops as they arrive, then the Sync."""

    def on_ops(self, ops: list[localv1.OpItem]) -> None:
        """More ops of the change set being received, none of them its Sync
        (zero or more calls before `on_changeset` or `on_stream_error`): a
        sink may take them into its state, never into its dataplane. Called
        on the client's event loop, between two messages: it must not wait
        (for a dataplane, the network, a lock held long)."""


@dataclass(frozen=True)
class ClientConfig:
    target: str
    node_name: str
    tls: TLSFiles = field(default_factory=TLSFiles)
    max_msg_size: int = 4 << 20
    error_delay: float = 1.0
    max_error_delay: float = 30.0
    # KPNG's brain is a grpc-go server with default settings: it answers pings
    # sent closer than 5 minutes apart on an idle stream with GOAWAY
    # "too_many_pings", so the default stays at 5 minutes.
    keepalive_time: float = 300.0
    keepalive_timeout: float = 20.0
    changeset_stall_timeout: float = 30.0
    max_changeset_size: int = 256 << 20
    # Ops handed to the sink at a time before their Sync: a batch of them
    # (about 3 MiB) is what the client holds of a full state.
    staged_batch: int = 4096


class _StreamCut(Exception):
    """The client gives up on a stream; `reason` is logged, `skip` counted."""

    def __init__(self, reason: str, skip: SkipReason | None) -> None:
        super().__init__(reason)
        self.reason, self.skip = reason, skip


class _StallGuard:
    """Closes the connection of a stream whose change set stopped making
    progress: once a change set's first message arrived, each next one must
    come within `timeout`. Between change sets (waiting for the brain's next
    one, or while the sink applies) there is no deadline. Checked on the
    stream's event loop, so a Sync just in time is never cut off."""

    def __init__(self, close: Callable[[], None], timeout: float,
                 clock: Callable[[], float]) -> None:
        self._close, self._timeout, self._clock = close, timeout, clock
        self._period = min(max(timeout / 4, 0.01), 1.0)  # precise enough, never a busy loop
        self._loop = asyncio.get_running_loop()
        self._deadline: float | None = None
        self._timer = self._loop.call_later(self._period, self._check)
        self.tripped = False

    def progress(self) -> None:
        """A message of a change set arrived (a plain store: once per op)."""
        self._deadline = self._clock() + self._timeout

    def changeset_done(self) -> None:
        self._deadline = None

    def close(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        if self._deadline is not None and self._clock() > self._deadline:
            self.tripped = True
            self._close()
            return
        self._timer = self._loop.call_later(self._period, self._check)


class _Outage:
    """The brain's outages as the log tells them: the stream failure that
    starts one is a warning, the failures during it are info lines (numbered),
    and its end (the first change set applied after it) is one info line
    saying how long it lasted."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._since: float | None = None
        self.failures = 0

    def failed(self) -> int:
        """A stream failed: the level to log it at."""
        if self._since is None:
            self._since, self.failures = self._clock(), 0
        self.failures += 1
        return logging.WARNING if self.failures == 1 else logging.INFO

    def applied(self) -> float | None:
        """A change set was applied: the outage's seconds, if one ended."""
        if self._since is None:
            return None
        lasted, self._since = self._clock() - self._since, None
        return lasted


class WatchClient:
    def __init__(self, config: ClientConfig, sink: OpsSink, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic,
                 random_unit: Callable[[], float] = random.random) -> None:
        self._config = config
        self._sink = sink
        self._metrics = metrics
        self._skips = Skips(metrics)
        self._clock = clock
        self._random_unit = random_unit
        self._stopping = ThreadsafeEvent()
        self._outage = _Outage(clock)

    def stop(self) -> None:
        """Stop from any thread; `run` returns soon after (once a change set
        being applied is). Not from a signal handler (it takes a lock): see
        kpng_py/runtime/termination.py."""
        self._stopping.set()

    def run(self) -> None:
        """Watch until `stop()`; never raises for stream or brain errors (only
        SinkFailed, from the sink).

        Backoff starts again from `error_delay` only after a stream that
        applied a change set and stayed up for at least `max_error_delay`: a
        stream that keeps failing soon after its full state (an oversized or
        undecodable message later on, a brain in a crash loop) is then retried
        at most once per `max_error_delay`, each retry being a full resync."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="watch-sink") as sink_thread:
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                runner.run(self._run(_SinkThread(sink_thread)))

    async def _run(self, sink: _SinkThread) -> None:
        config = self._config
        backoff = Backoff(config.error_delay, config.max_error_delay, self._random_unit)
        streams = 0
        while not self._stopping.is_set():
            if streams:
                self._metrics.brain_reconnects.inc()
            streams += 1
            opened = self._clock()
            applied = await self._until_stopped(self._watch_once(sink), False)
            self._metrics.brain_connected.set(0)
            if self._stopping.is_set():
                break
            if applied and self._clock() - opened >= config.max_error_delay:
                backoff.reset()
            wait = backoff.next()
            log.info("reconnecting to the brain", extra=fields(
                target=config.target, retry_in_s=round(wait, 3)))
            await self._until_stopped(asyncio.sleep(wait), None)

    async def _until_stopped(self, work: Coroutine[Any, Any, _T], stopped: _T) -> _T:
        """What `work` returns, or `stopped` if stop() came first (`work` is
        then cancelled)."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return stopped if task.cancelled() else task.result()

    async def _watch_once(self, sink: _SinkThread) -> bool:
        """One stream. True if it applied at least one change set."""
        config = self._config
        request = localv1.WatchReq(NodeName=config.node_name)
        changeset = _ChangeSet(config.max_changeset_size)
        applied = False
        guard: _StallGuard | None = None
        try:
            channel = open_channel(config.target, config.tls, config.keepalive_time,
                                   config.keepalive_timeout)
        except AddressError as err:  # TLS files that cannot be loaded (any more)
            await self._stream_failed(sink, f"UNAVAILABLE: {err}", changeset)
            return applied
        try:
            guard = _StallGuard(channel.close, config.changeset_stall_timeout, self._clock)
            async with WatchCall(channel, config.target, config.max_msg_size) as call:
                await call.send(request)
                while (messages := await call.next_messages()) is not None:
                    for message in messages:
                        if changeset.empty:
                            if not applied:  # the stream's first message: it is up
                                self._metrics.brain_connected.set(1)
                            await sink.call(self._sink.on_changeset_started)
                        guard.progress()
                        if not self._add(changeset, message):
                            if len(changeset.ops) >= config.staged_batch:
                                self._sink.on_ops(changeset.take_ops())
                            continue
                        guard.changeset_done()
                        ops = changeset.take_ops()
                        changeset = _ChangeSet(config.max_changeset_size)
                        await sink.call(self._sink.on_changeset, ops)  # the dataplane has it
                        applied = True
                        self._outage_ended()
                        await call.send(request)
                raise _StreamCut("the brain closed the stream", None)
        except SinkFailed:
            raise
        except _StreamCut as cut:
            await self._stream_failed(sink, cut.reason, changeset, cut.skip)
        except CallFailed as err:
            reason, skip = self._call_failure(err, guard)
            await self._stream_failed(sink, reason, changeset, skip)
        except Exception:  # a bug downstream must not stop the watch: resync instead
            log.exception("applying a change set failed; re-opening the stream to resync")
            self._metrics.dataplane_errors.labels("changeset").inc()
        finally:
            if guard is not None:
                guard.close()
            channel.close()
        return applied

    def _add(self, changeset: _ChangeSet, message: bytes) -> bool:
        """Adds one message to the change set; True when it was its Sync."""
        if not changeset.count(len(message)):
            limit = self._config.max_changeset_size
            raise _StreamCut(
                f"the change set's ops passed --max-changeset-size ({limit} bytes) before its "
                "Sync; dropped and retried (raise the flag if the brain's full state is "
                "really that large)", SkipReason.OVERSIZED_CHANGESET)
        try:
            op = localv1.OpItem.FromString(message)
        except DecodeError as err:
            self._skips.skip(SkipReason.BAD_OP, f"message {changeset.messages} of a change set",
                             f"not an OpItem ({err}); its {len(message)} bytes are dropped, "
                             "the rest of the change set is applied")
            return False
        changeset.ops.append(op)
        changeset.op_count += 1
        return op.WhichOneof("Op") == "Sync"

    def _call_failure(self, err: CallFailed,
                      guard: _StallGuard | None) -> tuple[str, SkipReason | None]:
        """What a failed call is reported as, and counted as (beyond a cut-short
        change set)."""
        if guard is not None and guard.tripped:
            return (f"no message for {self._config.changeset_stall_timeout:g} s in the middle "
                    "of a change set (--changeset-stall-timeout)", None)
        if err.oversized:
            return (f"{err} (raise --max-msg-size above the brain's largest message)",
                    SkipReason.OVERSIZED_MESSAGE)
        if err.status == "RESOURCE_EXHAUSTED" and not err.local:
            return f"the brain answered {err}", None
        return str(err), None

    def _outage_ended(self) -> None:
        failures = self._outage.failures
        lasted = self._outage.applied()
        if lasted is not None:
            log.info("watch stream to the brain is back", extra=fields(
                target=self._config.target, outage_s=round(lasted, 3),
                failed_streams=failures))

    async def _stream_failed(self, sink: _SinkThread, reason: str, partial: _ChangeSet,
                             skip: SkipReason | None = None) -> None:
        """One log line. A message over the size limit, a change set over its
        size limit, or else a change set cut short (ops without their Sync),
        is also counted as skipped: it is never applied, the next stream's
        full state supersedes it."""
        skip = skip or (SkipReason.INCOMPLETE_CHANGESET if partial.op_count else None)
        level = self._outage.failed()
        log.log(level, "watch stream to the brain failed", extra=fields(
            target=self._config.target, node=self._config.node_name, error=reason,
            discarded_ops=partial.op_count, reason=skip.value if skip else None,
            failures_in_outage=self._outage.failures if level != logging.WARNING else None))
        if skip is not None:
            self._metrics.skipped.labels(skip.value).inc()
        await sink.call(self._sink.on_stream_error, reason, partial.take_ops())


class _SinkThread:
    """Calls into the sink on its one worker thread, awaited by the loop."""

    def __init__(self, thread: ThreadPoolExecutor) -> None:
        self._thread = thread

    async def call(self, method: Callable[..., None], *args: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, method, *args)


class _ChangeSet:
    """One change set so far: its messages and their size in bytes, its ops
    and those of them not handed to the sink yet."""

    def __init__(self, max_size: int) -> None:
        self.ops: list[localv1.OpItem] = []
        self.messages = 0
        self.op_count = 0
        self._size, self._max_size = 0, max_size

    def take_ops(self) -> list[localv1.OpItem]:
        """The ops not handed over yet (from now on, handed over)."""
        ops, self.ops = self.ops, []
        return ops

    @property
    def empty(self) -> bool:
        return self.messages == 0

    def count(self, size: int) -> bool:
        """Counts one more message of `size` bytes; False once past the limit."""
        self.messages += 1
        self._size += size
        return self._size <= self._max_size
