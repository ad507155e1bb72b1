"""The connector's exception family.

Every error a user can meet is one of these, raised where the user's input is known, with the
actionable sentence first: Spark wraps Python errors several layers deep
(``STREAM_FAILED`` / ``PYTHON_EXCEPTION``), so the first line is what users read.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

_USERINFO = re.compile(r"(?P<lead>//|(?<![^\s'\"(,=]))(?P<user>[^\s'\"(,=/@:]*)(?P<password>:[^\s'\",/]*)?@(?=[\w\[])")
"""``user:password@`` or ``token@`` before a host: after ``//`` or at the start of a word (a server URL as
typed, even malformed: ``nats//alice:pw@host``, ``alice:pw@host``)."""
_NKEY_SEED = re.compile(r"\bS[UAONCXP][A-Z2-7]{56}\b")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S)
HIDDEN = "***"


def _hide_userinfo(match: re.Match[str]) -> str:
    if match.group("password") is None:  # nats://<token>@host
        return f"{match.group('lead')}{HIDDEN}@"
    return f"{match.group('lead')}{match.group('user')}:{HIDDEN}@"


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every secret replaced by ``***``: the password (or token) in a URL's userinfo
    (``nats://alice:***@host:4222``), nkey seeds, JWTs, PEM private keys, and each of ``secrets`` (option values).

    The one redaction of the connector: every error message goes through it (``JetStreamError``),
    and so does everything else that shows server URLs or options (``repr``, the command line).
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, HIDDEN)
    text = _USERINFO.sub(_hide_userinfo, text)
    return _JWT.sub(HIDDEN, _NKEY_SEED.sub(HIDDEN, _PRIVATE_KEY.sub(HIDDEN, text)))


class JetStreamError(Exception):
    """Base class of every error raised by spark-jetstream. Its message is redacted (``redact``)."""

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(redact(str(message)), *args)


class OptionError(JetStreamError, ValueError):
    """An option is unknown, missing or malformed."""


class SchemaError(JetStreamError, ValueError):
    """The DataFrame's columns do not fit the writer (missing, or of a type it cannot publish)."""


class ConnectError(JetStreamError):
    """No usable connection: unreachable server, refused credentials, TLS failure, no JetStream."""


class ClusterUnavailableError(ConnectError):
    """The cluster did not answer about a stream or consumer within the API deadline: a leader election
    (of the meta group or of the asset's group) that did not finish in time. Transient by nature, so
    callers that retry a ``ConnectError`` retry it; its message says what was happening and never
    suggests re-creating anything (the stream and consumer exist, as far as the cluster can tell)."""


class ServerTooOldError(ConnectError):
    """The server is older than a feature the read needs (``client.features``: groups, batched Direct Get)."""


class NotPermittedError(JetStreamError):
    """The server refused the NATS user a publish or subscribe the connector needs (a permissions violation)."""


class ApiError(JetStreamError):
    """The JetStream API answered with an error."""

    def __init__(self, message: str, code: int = 0, err_code: int = 0, description: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.description = description


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


class SparkVersionError(JetStreamError, ImportError):
    """PySpark is missing or older than the connector supports."""


def surfaced(cls: type[T]) -> type[T]:
    """``cls`` (a class Spark calls: the data source, its readers and writers) with each public method reporting the
    connector's own errors to Spark without their traceback, so the connector's sentence ends the first line Spark
    shows (``[STREAM_FAILED] ... perform latestOffset: spark_jetstream.errors.DataLossError: Messages ...``) instead of
    coming 20 lines down. Spark's Python worker formats the error it reports with ``SPARK_HIDE_TRACEBACK`` as it finds
    it then, and ends; the traceback goes to the log at DEBUG. Any other exception keeps its traceback."""
    for name, method in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(method):
            setattr(cls, name, _surfacing(method))
    return cls


def _surfacing(method: Callable[..., Any]) -> Callable[..., Any]:
    def hide(exc: JetStreamError) -> None:
        log.debug("%s failed", method.__qualname__, exc_info=exc)
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"

    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from method(*args, **kwargs))
            except JetStreamError as exc:
                hide(exc)
                raise

        return generator

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except JetStreamError as exc:
            hide(exc)
            raise

    return call
