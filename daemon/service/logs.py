"""The service's own log: structlog JSON lines on stdout, each with journald's priority prefix.

systemd reads a `<N>` at the start of a line a service writes (SyslogLevelPrefix, on by default) as the
record's priority, so `journalctl -p err -u flare-diagd` shows aborts, restore failures and store
failures. The standard library's loggers (the runner's, the store's) are routed through the same
processors, so every line of the service has one shape and one priority scheme.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

# syslog priorities (sd-daemon(3)): what journald files each level under
PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


def _priority_prefix(_logger: object, method: str, rendered: Any) -> str:
    """The last processor: the JSON line the renderer made, behind its journald priority."""
    return f"<{PRIORITY.get(method if method != 'exception' else 'error', 6)}>{rendered}"


class _ToStructlog(logging.Handler):
    """A standard-library record, logged again through structlog (its level kept, its logger named)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            log = structlog.get_logger("flare-diagd").bind(logger=record.name)
            level = record.levelname.lower()
            method = getattr(log, level if level in PRIORITY else "info")
            if record.exc_info:
                method(record.getMessage(), exc_info=record.exc_info)
            else:
                method(record.getMessage())
        except Exception:  # noqa: BLE001 - a log line must never take the service down
            self.handleError(record)


def configure(level: str = "info", stream=None) -> structlog.stdlib.BoundLogger:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
            _priority_prefix,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stdout),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger("flare_diag")
    root.handlers = [_ToStructlog()]
    root.setLevel(logging.getLevelName(level.upper()))
    root.propagate = False
    return structlog.get_logger("flare-diagd")
