"""SIGTERM and SIGINT: nothing runs in the signal handler but a write to a
pipe, the stop runs on a thread of its own, a busy process still exits after
the grace period, and a second signal exits at once. In this process (with a
stand-in for os._exit) and against real `kpng-py` processes."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from kpng_py.runtime.termination import GRACE_SECONDS, Termination
from kpng_py.serve.recording import RecordingWriter
from tests.streams.build import port, reset, service, set_service, sync
from tests.support.hostile import Abort, RawBrain
from tests.support.process import KPNG_PY, LOOPBACK_PROBES, WAIT_SECONDS, Processes, wait_until

pytestmark = pytest.mark.timeout(600)


class FakeExit:
    """Stands in for os._exit: records the code instead of ending pytest."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


def test_the_stop_runs_on_a_thread_of_its_own() -> None:
    stopped_on: list[str] = []
    done = threading.Event()

    def stop() -> None:
        stopped_on.append(threading.current_thread().name)
        done.set()

    exit_ = FakeExit()
    with Termination(stop, grace=60, exit_process=exit_):
        os.kill(os.getpid(), signal.SIGTERM)
        assert done.wait(WAIT_SECONDS)
    assert stopped_on and stopped_on[0] != threading.main_thread().name
    assert exit_.codes == []


def test_a_stop_that_needs_a_lock_the_main_thread_holds_waits_for_it() -> None:
    """The deadlock of issue 12: the handler used to call the client's stop,
    which took the lock the interrupted main thread was holding."""
    lock = threading.Lock()
    done = threading.Event()

    def stop() -> None:
        with lock:
            done.set()

    with Termination(stop, grace=60, exit_process=FakeExit()):
        with lock:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the Python-level handler runs here, in this thread
            assert not done.is_set()
        assert done.wait(WAIT_SECONDS)


def test_one_signal_counts_once_and_a_second_exits_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Each signal reaches the pipe twice (wakeup fd and handler); only a
    second signal exits, without waiting for the grace period."""
    exit_ = FakeExit()
    with Termination(lambda: None, grace=600, exit_process=exit_):
        os.kill(os.getpid(), signal.SIGTERM)
        assert not exit_.called.wait(1.0)
        os.kill(os.getpid(), signal.SIGINT)
        assert exit_.called.wait(WAIT_SECONDS)
    assert exit_.codes == [128 + signal.SIGINT]
    assert any("second signal (SIGINT)" in r.getMessage() for r in caplog.records)


def test_a_main_thread_still_busy_after_the_grace_period_exits(
        caplog: pytest.LogCaptureFixture) -> None:
    exit_ = FakeExit()
    with Termination(lambda: None, grace=0.3, exit_process=exit_):
        os.kill(os.getpid(), signal.SIGTERM)
        assert exit_.called.wait(WAIT_SECONDS)
    assert exit_.codes == [128 + signal.SIGTERM]
    assert any("not stopped 0.3 s after SIGTERM" in r.getMessage() for r in caplog.records)


def test_a_block_that_ends_in_time_disarms_the_exit_and_restores_the_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    exit_ = FakeExit()
    with Termination(lambda: None, grace=0.3, exit_process=exit_):
        os.kill(os.getpid(), signal.SIGTERM)
    assert not exit_.called.wait(1.0)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left behind


# Real processes.

def failing_brain(tmp_path: Path) -> tuple[RawBrain, str]:
    """A brain that fails every stream at once: the client lives in reconnects."""
    brain = RawBrain(then=[Abort(grpc.StatusCode.UNAVAILABLE, "failing on purpose")])
    return brain, brain.start(tmp_path / "failing.sock")


def test_sigterm_during_reconnects_always_stops_the_backend(tmp_path: Path) -> None:
    """20 runs, each stopped at a different point of its reconnect loop (the
    old handler deadlocked about one run in five)."""
    brain, target = failing_brain(tmp_path)
    chance = random.Random(12)
    try:
        with Processes(tmp_path) as processes:
            for run in range(20):
                backend = processes.start(
                    "local", "--api", target, "--error-delay", "0.001",
                    "--max-error-delay", "0.002", *LOOPBACK_PROBES, "to-print")
                backend.wait_for_log("reconnecting to the brain", count=chance.randint(1, 20))
                time.sleep(chance.uniform(0, 0.02))
                backend.popen.send_signal(signal.SIGTERM)
                try:
                    code = backend.popen.wait(30)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"run {run}: no exit 30 s after SIGTERM; "
                                f"stderr:\n{backend.stderr()}")
                assert code == 0, f"run {run}: exit code {code}; stderr:\n{backend.stderr()}"
    finally:
        brain.stop()


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is already full: the first write to it blocks
    before a byte is written, so a signal cannot cut it short (the write is
    retried), as with a stdout consumer that stopped reading."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 4096)
    os.set_blocking(write_end, True)
    return read_end, write_end


def blocked_in_pipe_write(pid: int) -> bool:
    """Any of its threads (the watch client applies on a thread of its own)."""
    for wchan in Path(f"/proc/{pid}/task").glob("*/wchan"):
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            if wchan.read_text().endswith("pipe_write"):
                return True
    return False


@pytest.fixture
def stuck_backend(tmp_path: Path):
    """`kpng-py local ... to-print` stuck for good inside its first apply,
    writing the state to a stdout nobody reads."""
    svc = service("web", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    brain = RawBrain([[reset(), set_service(svc), sync()]])
    target = brain.start(tmp_path / "brain.sock")
    stderr = tmp_path / "backend.log"
    read_end, write_end = full_pipe()
    with stderr.open("w") as err:
        backend = subprocess.Popen([KPNG_PY, "local", "--api", target, *LOOPBACK_PROBES,
                                    "to-print"], stdout=write_end, stderr=err)
    os.close(write_end)
    try:
        wait_until(lambda: backend.poll() is not None or blocked_in_pipe_write(backend.pid),
                   "to-print to block on its stdout", 60)
        assert backend.poll() is None, stderr.read_text()
        yield backend, stderr
    finally:
        if backend.poll() is None:
            backend.kill()
        backend.wait()
        os.close(read_end)
        brain.stop()


def test_a_backend_stuck_in_an_apply_exits_after_the_grace_period(stuck_backend) -> None:
    backend, stderr = stuck_backend
    backend.send_signal(signal.SIGTERM)
    code = backend.wait(GRACE_SECONDS + 30)
    assert code == 128 + signal.SIGTERM
    assert f"not stopped {GRACE_SECONDS:g} s after SIGTERM" in stderr.read_text()


def test_a_second_signal_exits_a_stuck_backend_at_once(stuck_backend) -> None:
    backend, stderr = stuck_backend
    backend.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in stderr.read_text(), "the first signal's log line")
    backend.send_signal(signal.SIGINT)
    code = backend.wait(GRACE_SECONDS + 30)
    assert code == 128 + signal.SIGINT
    log = stderr.read_text()
    assert "second signal (SIGINT)" in log and "not stopped" not in log


def test_every_command_stops_on_sigterm_through_the_same_mechanism(tmp_path: Path) -> None:
    """Each logs the termination thread's `stopping` line and exits 0."""
    svc = service("web", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    brains = [RawBrain([[reset(), set_service(svc), sync()]]) for _ in range(2)]  # then quiet
    local_api, record_api = (b.start(tmp_path / f"raw-{i}.sock") for i, b in enumerate(brains))
    recording = tmp_path / "rec.jsonl"
    with recording.open("w") as recording_out:
        writer = RecordingWriter(recording_out)
        for op in (reset(), set_service(svc), sync()):
            writer.op(op)
    state_file = tmp_path / "state.yaml"
    state_file.write_text("services: []\n")
    old = time.time() - 60
    os.utime(state_file, (old, old))  # saved a while ago: no settling to wait for
    commands = {
        "local": (["local", "--api", local_api, *LOOPBACK_PROBES, "to-print"], "sync applied"),
        "record": (["record", "--api", record_api, "-o", str(tmp_path / "out.jsonl")], None),
        "replay": (["replay", "-i", str(recording), "to-api", "--listen",
                    f"unix://{tmp_path / 'replay.sock'}"], "serving localv1"),
        "file to-api": (["file", "-i", str(state_file), "to-api", "--listen",
                         f"unix://{tmp_path / 'file.sock'}"], "serving localv1"),
        "file to-local": (["file", "-i", str(state_file), "to-local", *LOOPBACK_PROBES,
                           "to-print"], "sync applied"),
    }
    try:
        with Processes(tmp_path) as processes:
            for name, (argv, ready) in commands.items():
                process = processes.start(*argv)
                if ready is None:  # record logs nothing while all is well
                    recorded = tmp_path / "out.jsonl"
                    wait_until(lambda: recorded.exists() and '"Sync"' in recorded.read_text(),
                               "the recorded sync", 30)
                else:
                    process.wait_for_log(ready, seconds=30)
                code = process.terminate()
                assert code == 0, f"{name}: exit code {code}; stderr:\n{process.stderr()}"
                assert process.log_lines("stopping signal=SIGTERM grace_s=10"), name
    finally:
        for brain in brains:
            brain.stop()
