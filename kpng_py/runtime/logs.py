"""Logging set-up: text or JSON lines, with structured fields.

Call sites attach fields with ``extra=fields(key=value, ...)``; the formatters
render them as ``key=value`` (text) or as JSON members, and leave out a field
whose value is None (it has no value to show).

Every record is exactly one line in both formats, whatever it carries: names
and values come from the brain, and a newline in a service name must not forge
a log line. The text format escapes control characters (C0, DEL, C1, U+2028,
U+2029) in the message and in field values, and renders a traceback as an
escaped ``error=`` field; the JSON format escapes them as JSON does.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import sys
from typing import Any

_FIELDS_ATTR = "kpng_fields"

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_LINE_BREAKING = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]
_CONTROL_ESCAPES = {
    code: _NAMED_ESCAPES.get(chr(code), f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}")
    for code in _LINE_BREAKING
}
# Inside a quoted field value, the quote and the escape character are escaped too.
_QUOTED_ESCAPES = {**_CONTROL_ESCAPES, ord('"'): '\\"', ord("\\"): "\\\\"}
_NEEDS_QUOTES = frozenset(' "=\\') | frozenset(map(chr, _LINE_BREAKING))


def fields(**values: Any) -> dict[str, dict[str, Any]]:
    """Structured fields for one log call: ``log.info("msg", extra=fields(a=1))``."""
    return {_FIELDS_ATTR: values}


def _escape_control(text: str) -> str:
    """`text` with every control or line-breaking character escaped."""
    return text.translate(_CONTROL_ESCAPES)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call attached with `fields` (none: an empty dict)."""
    return getattr(record, _FIELDS_ATTR, {})


def _failure_fields(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, str]:
    """The record's traceback and stack, as the fields `error` and `stack`."""
    failure = {}
    if record.exc_info:
        failure["error"] = formatter.formatException(record.exc_info)
    if record.stack_info:
        failure["stack"] = formatter.formatStack(record.stack_info)
    return failure


class TextFormatter(logging.Formatter):
    """`TIME LEVEL LOGGER: MESSAGE key=value ...`; a field whose value is
    None is left out, as in the JSON format."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = _escape_control(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        extra = {**record_fields(record), **_failure_fields(self, record)}
        pairs = " ".join(f"{k}={_text_value(v)}" for k, v in extra.items() if v is not None)
        return f"{line} {pairs}" if pairs else line


def _text_value(value: Any) -> str:
    text = str(value)
    if text and _NEEDS_QUOTES.isdisjoint(text):
        return text
    return f'"{text.translate(_QUOTED_ESCAPES)}"'


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts` in RFC 3339, UTC, milliseconds
    (`2026-12-02T06:05:12.345Z`); a field whose value is None is left out
    rather than written as "None"."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": rfc3339_milliseconds(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update({k: _json_value(v) for k, v in record_fields(record).items()
                     if v is not None})
        body.update(_failure_fields(self, record))
        return json.dumps(body)


def rfc3339_milliseconds(epoch_seconds: float) -> str:
    when = datetime.datetime.fromtimestamp(epoch_seconds, tz=datetime.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json_value(value: Any) -> Any:
    """Numbers and booleans as they are (nan and inf are not JSON: as text)."""
    if isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return str(value)


# The name of the handler `setup_logging` puts on the root logger.
HANDLER_NAME = "kpng-py"


def setup_logging(log_format: str = "text", verbosity: int = 0) -> None:
    """Log to stderr (stdout is reserved for `to-print`). -v: debug."""
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    if verbosity < 2:
        handler.addFilter(_quiet_libraries)


# grpclib (an INFO line per stream a client cancels), h2, pyroute2 and asyncio
# are chatty below warnings; only our -vv shows them. A filter on the handler,
# not the libraries' levels: pyroute2 sets its own logger's level when it is
# imported, which the backends do after the logging is set up.
_NOISY_LIBRARIES = ("grpclib", "h2", "hpack", "pyroute2", "asyncio")


def _quiet_libraries(record: logging.LogRecord) -> bool:
    """False (drop) for a noisy library's record below a warning."""
    return (record.levelno >= logging.WARNING
            or record.name.partition(".")[0] not in _NOISY_LIBRARIES)
