"""The connector's exception family.

Every error a user can meet is one of these, raised where the user's input is known, with the
actionable sentence first: Spark wraps Python errors several layers deep
(``STREAM_FAILED`` / ``PYTHON_EXCEPTION``), so the first line is what users read.
"""

from __future__ import annotations


class JetStreamError(Exception):
    """Base class of every error raised by spark-jetstream."""


class OptionError(JetStreamError, ValueError):
    """An option is unknown, missing or malformed."""


class SchemaError(JetStreamError, ValueError):
    """The DataFrame's columns do not fit the writer (missing, or of a type it cannot publish)."""


class ConnectError(JetStreamError):
    """No usable connection: unreachable server, refused credentials, TLS failure, no JetStream."""


class ServerTooOldError(ConnectError):
    """The server lacks a feature the connector needs (priority groups, consumer RESET)."""


class ApiError(JetStreamError):
    """The JetStream API answered with an error."""

    def __init__(self, message: str, code: int = 0, err_code: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code


class StreamNotFoundError(ApiError):
    """The named stream does not exist."""


class ConsumerNotFoundError(ApiError):
    """The named consumer does not exist."""


class GroupConfigError(JetStreamError):
    """A consumer group's configuration is missing, malformed or does not fit the stream."""


class DataLossError(JetStreamError):
    """Messages a batch needs were removed before they were read."""


class FencedError(JetStreamError):
    """A newer reader took this member consumer's pin: this read attempt is obsolete."""


class ReaderError(JetStreamError):
    """A pull could not make progress (another client holds the pin, the consumer vanished, ...)."""
