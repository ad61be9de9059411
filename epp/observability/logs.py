"""Structured logs: one JSON object per line (default) or plain text for humans.

JSON keys: ts (RFC 3339 with milliseconds, UTC, unless another time encoding is asked for),
level, logger, msg, plus any `extra=` fields, the exception (exc) and, above a stacktrace level,
the caller's stack (stacktrace).

Time encodings are controller-runtime's `--zap-time-encoding` values, so GIE's flag means the same:
epoch (seconds, float), millis (float), nano (integer), iso8601, rfc3339, rfc3339nano.
"""

from __future__ import annotations

import datetime
import logging
import math
import sys
import time
import traceback
from typing import Any

import msgspec

_STD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_encode = msgspec.json.Encoder().encode


TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")


def encode_time(created: float, encoding: str | None) -> str | float | int:
    """`created` (a LogRecord's epoch seconds) as `encoding` renders it; None: RFC 3339 with ms."""
    if encoding == "epoch":
        return created
    if encoding == "millis":
        return created * 1e3
    if encoding == "nano":
        return int(created * 1e9)
    moment = datetime.datetime.fromtimestamp(created, datetime.UTC)
    if encoding == "rfc3339":
        return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    if encoding == "rfc3339nano":
        return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")  # Python has us
    if encoding == "iso8601":
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if encoding is None:
        return moment.isoformat(timespec="milliseconds")
    raise ValueError(f"unknown time encoding {encoding!r} (one of {', '.join(TIME_ENCODINGS)})")


class JsonFormatter(logging.Formatter):
    def __init__(self, time_encoding: str | None = None) -> None:
        super().__init__()
        encode_time(0.0, time_encoding)  # fail now on a bad name, not per record
        self.time_encoding = time_encoding

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": encode_time(record.created, self.time_encoding),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stacktrace"] = record.stack_info  # zap's key
        return _encode(out).decode()


class TextFormatter(logging.Formatter):
    def __init__(self, time_encoding: str | None = None) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        encode_time(0.0, time_encoding)
        self.time_encoding = time_encoding

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if self.time_encoding is None:
            return super().formatTime(record, datefmt)
        return str(encode_time(record.created, self.time_encoding))


class StackAbove(logging.Filter):
    """zap's stacktrace level: records at `level` or above carry the stack of the call that logged.

    A filter runs in the logging call's own thread, so the stack it takes is the caller's; the
    frames of the logging module itself are cut off the end.
    """

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level and not record.exc_info and not record.stack_info:
            frames = traceback.extract_stack()
            while frames and (frames[-1].filename == logging.__file__ or frames[-1].filename == __file__):
                frames.pop()
            record.stack_info = "Stack (most recent call last):\n" + "".join(traceback.format_list(frames))
        return True


class Throttle:
    """At most one line per `interval` seconds for a warning that can come with every request
    or message (a limit reached, a peer refused): the lines swallowed in between are counted,
    and the next line that passes says how many. One event loop (or thread) per instance."""

    __slots__ = ("at", "interval", "suppressed")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.at = -math.inf
        self.suppressed = 0

    def log(
        self,
        logger: logging.Logger,
        level: int,
        msg: str,
        *args: object,
        extra: Any = None,
        exc_info: bool = False,
    ) -> bool:
        """Log `msg % args` unless a line passed less than `interval` ago; whether it did."""
        now = time.monotonic()
        if now - self.at < self.interval:
            self.suppressed += 1
            return False
        if self.suppressed:
            msg += " (%d more since the last report)"
            args = (*args, self.suppressed)
        # stacklevel: the caller, not this line
        logger.log(level, msg, *args, extra=extra, exc_info=exc_info, stacklevel=2)
        self.at = now
        self.suppressed = 0
        return True


def setup(
    *,
    level: str = "info",
    fmt: str = "json",
    time_encoding: str | None = None,
    stacktrace_level: str | None = None,
) -> None:
    """Log to stderr at `level` as JSON lines or text; `stacktrace_level` (a level name) adds the
    caller's stack to records at or above it (zap's --zap-stacktrace-level)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(time_encoding))
    else:
        handler.setFormatter(TextFormatter(time_encoding))
    if stacktrace_level is not None:
        handler.addFilter(StackAbove(logging.getLevelNamesMapping()[stacktrace_level.upper()]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would add a line per scrape of our /metrics.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
