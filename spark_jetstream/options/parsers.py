"""Option value parsers: the text Spark hands over -> typed values, or ``ValueError`` saying what was expected.

``options.Option.convert`` turns the ``ValueError`` into an ``OptionError`` that names the option.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from urllib.parse import urlsplit

from spark_jetstream.client.subjects import filter_problem, overlapping

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"500ms"``, ``"5s"``, ``"2m"``, ``"1h"`` or a bare number of seconds -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError("expected a duration such as 500ms, 5s, 2m or 1h")
    unit = match.group(2).lower() if match.group(2) else None
    return float(match.group(1)) * _DURATION_UNITS[unit]


DEFAULT_PRIORITY_TIMEOUT = 120.0
"""Seconds a pin survives without a pull that carries its id: the member consumers' ``priority_timeout``
(option ``priorityTimeout``; the server's default)."""


def parse_int(text: str) -> int:
    try:
        return int(text.strip().replace("_", ""))
    except ValueError:
        raise ValueError("expected a whole number") from None


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


def parse_positive_int(text: str) -> int:
    value = parse_int(text)
    if value <= 0:
        raise ValueError("expected a whole number greater than 0")
    return value


def parse_size(text: str) -> int:
    """``"512k"``, ``"64m"``, ``"1g"`` or a number of bytes."""
    match = re.match(r"^\s*(\d+)\s*([kmg]?)b?\s*$", text, re.IGNORECASE)
    if not match:
        raise ValueError("expected a size such as 1048576, 512k, 64m or 1g")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2).lower() or " ")


def _position(text: str, names: tuple[str, ...], first: int) -> str | int:
    """One of ``names`` or a stream sequence of at least ``first``."""
    lowered = text.strip().lower()
    if lowered in names:
        return lowered
    try:
        seq = int(lowered)
    except ValueError:
        raise ValueError(f"expected {', '.join(names)} or a stream sequence number") from None
    if seq < first:
        raise ValueError("a stream sequence starts at 1" if first else "a stream sequence is not negative")
    return seq


def parse_position(text: str) -> str | int:
    """``earliest``, ``latest``, ``group``, ``snapshot`` (a KV bucket's changes) or a stream sequence to start at."""
    return _position(text, ("earliest", "latest", "group", "snapshot"), 1)


def parse_timestamp(text: str) -> datetime:
    """An ISO-8601 time (``2026-01-31T12:00:00Z``) or milliseconds since the epoch."""
    stripped = text.strip()
    if stripped.isdigit():
        try:
            return datetime.fromtimestamp(int(stripped) / 1000, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise ValueError("epoch milliseconds out of range") from None
    try:
        parsed = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("expected an ISO-8601 time such as 2026-01-31T12:00:00Z or epoch milliseconds") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_TOKEN = r"(?:[^\s.*>][^\s.]*|[*>][^\s.]+)"
SUBJECT_PATTERN = rf"^{_TOKEN}(?:\.{_TOKEN})*$"
"""A publishable subject: dot-separated non-empty tokens without whitespace, none of them a wildcard
(``*`` or ``>`` alone); RE2 and Python syntax."""


def parse_name(text: str) -> str:
    """A stream or group name: letters, digits, ``-`` and ``_`` (no dots, spaces or wildcards)."""
    stripped = text.strip()
    if not _NAME.match(stripped):
        raise ValueError("use only letters, digits, '-' and '_'")
    return stripped


def parse_subject(text: str) -> str:
    """A subject to publish to: dot-separated tokens without whitespace or wildcards."""
    stripped = text.strip()
    if not re.match(SUBJECT_PATTERN, stripped):
        raise ValueError("expected a subject such as orders.eu.new (no spaces, empty tokens or wildcards)")
    return stripped


def parse_api_prefix(text: str) -> str:
    """A JetStream API prefix (``JS.OWNER.API``): a subject without wildcards; a trailing dot or ``.>`` of the
    import's ``to`` is dropped."""
    return _subject_prefix(text, "the subject prefix the JetStream API is imported under, such as JS.OWNER.API")


def parse_inbox_prefix(text: str) -> str:
    """Where replies come to (``_INBOX.spark-team``): a subject without wildcards; a trailing ``.>`` is dropped."""
    return _subject_prefix(text, "the subject prefix replies come to, such as _INBOX.spark-team")


def _subject_prefix(text: str, expected: str) -> str:
    stripped = text.strip().removesuffix(".>").removesuffix(".")
    if not re.match(SUBJECT_PATTERN, stripped):
        raise ValueError(f"expected {expected} (no spaces, empty tokens or wildcards)")
    return stripped


def parse_subject_filters(text: str) -> tuple[str, ...]:
    """Comma-separated subject filters (``*`` and ``>`` wildcards), no two of which match the same subject: a
    message on both would be read twice."""
    filters = tuple(part.strip() for part in text.split(","))
    for subject in filters:
        if (problem := filter_problem(subject)) is not None:
            raise ValueError(f"{problem}; expected comma-separated subject filters such as orders.eu.>,orders.*.new")
    if (pair := overlapping(filters)) is not None:
        raise ValueError(
            f"filters {pair[0]!r} and {pair[1]!r} both match some subjects, whose messages would be read twice: "
            "give filters that do not overlap"
        )
    return filters


ACK_POLICIES = ("explicit", "none")


def parse_ack_policy(text: str) -> str:
    """The member consumers' JetStream ack policy: ``explicit`` or ``none``."""
    lowered = text.strip().lower()
    if lowered not in ACK_POLICIES:
        raise ValueError("expected explicit or none")
    return lowered


READ_MODES = ("auto", "direct", "pull")


def parse_read_mode(text: str) -> str:
    """How executors read: ``auto`` (Direct Get where the stream and the user allow it, else pull), ``direct``
    or ``pull``."""
    lowered = text.strip().lower()
    if lowered not in READ_MODES:
        raise ValueError("expected auto, direct or pull")
    return lowered


def parse_end_position(text: str) -> str | int:
    """``latest`` or the last stream sequence to read (inclusive)."""
    return _position(text, ("latest",), 0)


def parse_text(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


_HOST = re.compile(r"^[A-Za-z0-9_.-]+$|:")  # a host name, an IPv4 address, or an IPv6 address (has ':')


def parse_servers(text: str) -> tuple[str, ...]:
    """A comma-separated list of ``nats://host:port`` (``host:port``, ``tls://``, ``ws://`` and ``wss://``
    also accepted). Anything else is refused here, before any connection is tried."""
    servers = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        url = entry if "://" in entry else f"nats://{entry}"
        parts = urlsplit(url)
        malformed = ValueError(f"{entry!r} is malformed: expected a server URL such as nats://host:4222")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{entry!r} has a malformed port") from None
        websocket = parts.scheme in ("ws", "wss")  # a websocket URL may have a path
        if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname or not _HOST.search(parts.hostname):
            raise malformed
        if parts.fragment or (not websocket and (parts.query or parts.path.strip("/"))):
            raise malformed
        if port is None and not websocket:
            url = f"{url.rstrip('/')}:4222"
        servers.append(url)
    if not servers:
        raise ValueError("name at least one server, e.g. nats://localhost:4222")
    return tuple(servers)
