"""Where the connector's warnings show when nothing else shows them: Spark's Python processes (the streaming source's
driver-side worker, the executors' workers) configure no logging, and Python's last-resort handler prints a bare line
(no time, level or logger). There they go to stderr, into the driver's or executor's log, as Spark's own lines read."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%y/%m/%d %H:%M:%S"  # log4j's in Spark's default console layout


class UnlessConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Warnings and worse to stderr, unless the application logs them itself (a root handler, or another handler
    on the way up)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return
            logger = logger.parent if logger.propagate else None
        self.stream = sys.stderr  # as the last-resort handler: the stderr of the moment (pytest swaps it)
        super().emit(record)


def install() -> None:
    """Once per process, on the package's logger."""
    logger = logging.getLogger("spark_jetstream")
    if not any(isinstance(handler, UnlessConfigured) for handler in logger.handlers):
        logger.addHandler(UnlessConfigured())
