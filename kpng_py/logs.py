"""Logging set-up: text or JSON lines, with structured fields.

Call sites attach fields with ``extra=fields(key=value, ...)``; the formatters
render them as ``key=value`` (text) or as JSON members.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_FIELDS_ATTR = "kpng_fields"


def fields(**values: Any) -> dict[str, dict[str, Any]]:
    """Structured fields for one log call: ``log.info("msg", extra=fields(a=1))``."""
    return {_FIELDS_ATTR: values}


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    return getattr(record, _FIELDS_ATTR, {})


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={_text_value(v)}" for k, v in _record_fields(record).items())
        return f"{line} {extra}" if extra else line


def _text_value(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=')) else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update({k: v if isinstance(v, (int, float, bool)) else str(v)
                     for k, v in _record_fields(record).items()})
        if record.exc_info:
            body["error"] = self.formatException(record.exc_info)
        return json.dumps(body)


def setup_logging(log_format: str = "text", verbosity: int = 0) -> None:
    """Log to stderr (stdout is reserved for `to-print`). -v: debug."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    # grpc and pyroute2 are chatty at debug level; only our -vv shows them.
    for noisy in ("grpc", "pyroute2", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbosity > 1 else logging.WARNING)
