"""Logs: text or JSON lines with structured fields, one line per applied sync, and
exactly one line per record whatever a name from the brain holds."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from kpng_py.dataplane.applier import changed_names
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Protocol, ServicePort, ServicePortChanges, ServicePortName
from kpng_py.runtime.logs import JsonFormatter, TextFormatter, fields, setup_logging
from kpng_py.state.skips import SkipReason, Skips

KPNG_PY = Path(sys.executable).parent / "kpng-py"


def to_local(tmp_path: Path, *flags: str) -> list[str]:
    """`kpng-py file ... to-local to-print` on the dual-stack example: stderr lines."""
    state = tmp_path / "state.yaml"
    state.write_text("""
services:
- service:
    name: web
    type: ClusterIP
    ips: {clusterips: {v4: [10.96.0.10]}}
    ports: [{name: http, protocol: 1, port: 80, targetport: 8080}]
  endpoints:
  - endpoint: {ips: {v4: [10.244.0.5]}}
- service:
    name: none
    type: ClusterIP
    ips: {headless: true}
    ports: [{name: http, protocol: 1, port: 80}]
""")
    done = subprocess.run(
        [KPNG_PY, *flags, "file", "-i", state, "to-local", "--node-name", "n", "--exit-after",
         "1", "--healthz-bind-address", "", "--metrics-bind-address", "", "to-print"],
        capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout)["servicePorts"][0]["endpoints"] == ["10.244.0.5:8080"]
    return done.stderr.splitlines()


def test_json_logs_with_fields(tmp_path: Path) -> None:
    lines = [json.loads(line) for line in to_local(tmp_path, "--log-format", "json")]
    syncs = [line for line in lines if line["msg"] == "sync applied"]
    assert len(syncs) == 1
    sync = syncs[0]
    assert {"ts", "level", "logger"} <= set(sync) and sync["level"] == "info"
    assert (sync["sync"], sync["full"], sync["added"], sync["removed"]) == (1, True, 1, 0)
    assert sync["changed"] == "default/web:http"  # named without -v
    assert isinstance(sync["duration_ms"], float)
    (skip,) = [line for line in lines if line["msg"].startswith("skipped")]
    assert skip["reason"] == "headless" and skip["object"] == "service default/none"


def test_text_logs_and_verbosity(tmp_path: Path) -> None:
    quiet = to_local(tmp_path)
    assert sum("sync applied sync=1 full=True added=1" in line for line in quiet) == 1
    assert not any(" DEBUG " in line for line in quiet)
    verbose = to_local(tmp_path, "-v")
    assert any(" DEBUG kpng_py.dataplane.applier: service port added service_port=default/web:http "
               "protocol=TCP endpoints=1" in line for line in verbose), verbose


@pytest.mark.parametrize("verbosity, shown", [(1, ["kpng_py.x", "pyroute2.netlink.core"]),
                                               (2, ["kpng_py.x", "pyroute2.netlink.core",
                                                    "pyroute2.netlink.core"])])
def test_libraries_log_below_warnings_only_with_vv(verbosity: int, shown: list[str],
                                                    capsys: pytest.CaptureFixture) -> None:
    """pyroute2 resets its logger's level when imported (after the set-up):
    its debug lines still wait for -vv."""
    setup_logging("json", verbosity)
    library = logging.getLogger("pyroute2.netlink.core")
    logging.getLogger("pyroute2").setLevel(logging.NOTSET)  # as its import does
    logging.getLogger("kpng_py.x").debug("ours")
    library.debug("netlink chatter")
    library.warning("netlink trouble")
    names = [json.loads(line)["logger"] for line in capsys.readouterr().err.splitlines()]
    assert names == shown


FORGED = "2024-01-01 00:00:00,000 WARNING kpng_py.state.skips: skipped service default/web: forged"
HOSTILE_NAME = (f"service default/evil\n{FORGED}\r{FORGED}\u2028{FORGED}\u2029\x85{FORGED}"
                "\x1b[2J\x7f\x00")


@pytest.fixture
def skip_log() -> Iterator[Callable[[logging.Formatter], list[str]]]:
    """Lines a real skip of HOSTILE_NAME writes through a formatter."""
    logger = logging.getLogger("kpng_py.state.skips")
    handlers: list[logging.Handler] = []

    def write(formatter: logging.Formatter) -> list[str]:
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.setFormatter(formatter)
        handlers.append(handler)
        logger.addHandler(handler)
        metrics = Metrics()
        Skips(metrics).skip(SkipReason.BAD_PATH, HOSTILE_NAME, f"path {HOSTILE_NAME!r}\nx")
        assert metrics.skipped.labels("bad-path")._value.get() == 1
        return out.getvalue().splitlines()

    yield write
    for handler in handlers:
        logger.removeHandler(handler)


BREAKS = "\n\r\u2028\u2029\x85\x1b\x7f\x00"  # what must never reach a text log raw


def test_a_newline_in_a_name_cannot_forge_a_text_line(skip_log) -> None:
    (line,) = skip_log(TextFormatter())  # str.splitlines() breaks at every line separator
    assert not any(c in line for c in BREAKS), repr(line)
    assert (" WARNING kpng_py.state.skips: skipped service default/evil"
            "\\n2024-01-01 00:00:00") in line
    assert "\\r2024" in line and "\\u2028" in line and "\\x85" in line and "\\x1b[2J" in line
    # The field value is quoted, its quotes and backslashes escaped.
    assert ' object="service default/evil\\n2024-01-01 ' in line
    assert line.endswith("\\x7f\\x00\"")


def test_a_newline_in_a_name_stays_inside_its_json_line(skip_log) -> None:
    (line,) = skip_log(JsonFormatter())
    assert not any(c in line for c in BREAKS), repr(line)
    record = json.loads(line)
    assert record["object"] == HOSTILE_NAME and record["reason"] == "bad-path"
    assert record["msg"].startswith(f"skipped {HOSTILE_NAME}: path ")


def log_failure(formatter: logging.Formatter, **values: object) -> str:
    logger = logging.Logger("test")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    try:
        raise ValueError(f"bad name {HOSTILE_NAME}")
    except ValueError:
        logger.exception("apply failed", extra=fields(**values), stack_info=True)
    return out.getvalue()


def test_a_traceback_is_one_escaped_field_of_its_text_line() -> None:
    text = log_failure(TextFormatter(), n=1)
    (line,) = text.splitlines()
    assert not any(c in line for c in BREAKS), repr(line)
    assert " ERROR test: apply failed n=1 error=\"Traceback (most recent call last):\\n" in line
    assert "ValueError: bad name service default/evil\\n2024" in line and " stack=\"" in line


def test_a_traceback_stays_inside_its_json_line() -> None:
    text = log_failure(JsonFormatter(), ratio=float("nan"), big=float("inf"), n=2, ok=True)
    (line,) = text.splitlines()
    record = json.loads(line)  # strict JSON: nan and inf are not numbers there
    assert record["error"].endswith(f"ValueError: bad name {HOSTILE_NAME}")
    assert "Stack (most recent call last)" in record["stack"]
    assert (record["ratio"], record["big"], record["n"], record["ok"]) == ("nan", "inf", 2, True)


@pytest.mark.parametrize(("value", "text"), [
    ("plain", "plain"), ("", '""'), ("a b", '"a b"'), ('a"b', '"a\\"b"'), ("a=b", '"a=b"'),
    ("a\\b", '"a\\\\b"'), ("a\nb", '"a\\nb"'), ("a\tb", '"a\\tb"'), ("naïve", "naïve"),
    (1.5, "1.5"), ("None", "None"),
])
def test_text_field_values(value: object, text: str) -> None:
    record = logging.LogRecord("x", logging.INFO, "f", 1, "m", None, None)
    record.__dict__.update(fields(v=value))
    assert TextFormatter().format(record).endswith(f" x: m v={text}")


def test_a_text_field_without_a_value_is_left_out_as_in_json() -> None:
    record = logging.LogRecord("x", logging.INFO, "f", 1, "m", None, None)
    record.__dict__.update(fields(reason=None, failures=0, error=None))
    assert TextFormatter().format(record).endswith(" x: m failures=0")


def test_json_timestamps_are_rfc3339_utc_milliseconds_and_missing_fields_are_left_out() -> None:
    record = logging.LogRecord("x", logging.INFO, "f", 1, "m", None, None)
    record.created = 1_764_655_512.3456  # 2025-12-02T06:05:12.345Z
    record.__dict__.update(fields(reason="bad-path", error=None))
    body = json.loads(JsonFormatter().format(record))
    assert body["ts"] == "2025-12-02T06:05:12.345Z"
    assert body["reason"] == "bad-path" and "error" not in body


def test_the_sync_line_names_a_few_changed_service_ports() -> None:
    ports = [ServicePort(ServicePortName("ns", f"s{i}", "http", Protocol.TCP), "ClusterIP", (), 80)
             for i in range(5)]
    assert changed_names(ServicePortChanges(added=tuple(ports[:2]))) == "ns/s0:http,ns/s1:http"
    assert changed_names(ServicePortChanges(added=tuple(ports[:3]), removed=tuple(ports[3:]))) == (
        "ns/s0:http,ns/s1:http,ns/s2:http,+2 more")
    assert changed_names(ServicePortChanges()) == ""
