"""Every option: its name, type, default and documentation, defined once.

Spark hands options over as strings in a case-insensitive map. ``parse_options`` turns them into
typed values, refusing unknown names (suggesting the closest valid one) and malformed values
(naming the option and the expected form). The README's option table is generated from these
definitions, so code and docs cannot drift apart.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from .errors import OptionError

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
(the server's default)."""


def parse_pull_expires(text: str) -> float:
    """A duration well under half the member consumers' ``priority_timeout``, or the pin lapses between pulls."""
    seconds = parse_duration(text)
    if seconds * 2 >= DEFAULT_PRIORITY_TIMEOUT:
        raise ValueError(
            f"it must stay under half the member consumers' priority_timeout ({DEFAULT_PRIORITY_TIMEOUT:g}s), "
            f"or the pin lapses between pulls: use at most {DEFAULT_PRIORITY_TIMEOUT / 2 - 1:g}s"
        )
    return seconds


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


def parse_position(text: str) -> str | int:
    """``earliest``, ``latest``, ``group`` or a stream sequence to start at."""
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest", "group"):
        return lowered
    try:
        seq = int(lowered)
    except ValueError:
        raise ValueError("expected earliest, latest, group or a stream sequence number") from None
    if seq < 1:
        raise ValueError("a stream sequence starts at 1")
    return seq


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


ACK_POLICIES = ("explicit", "none")


def parse_ack_policy(text: str) -> str:
    """The member consumers' JetStream ack policy: ``explicit`` or ``none``."""
    lowered = text.strip().lower()
    if lowered not in ACK_POLICIES:
        raise ValueError("expected explicit or none")
    return lowered


def parse_end_position(text: str) -> str | int:
    """``latest`` or the last stream sequence to read (inclusive)."""
    lowered = text.strip().lower()
    if lowered == "latest":
        return lowered
    try:
        seq = int(lowered)
    except ValueError:
        raise ValueError("expected latest or a stream sequence number") from None
    if seq < 0:
        raise ValueError("a stream sequence is not negative")
    return seq


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


@dataclass(frozen=True)
class Option:
    """One user-facing option."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    secret: bool = False
    minimum: float | None = None
    required: bool = False

    def convert(self, raw: str) -> Any:
        shown = "<hidden>" if self.secret else repr(raw)
        try:
            value = self.parse(raw)
        except ValueError as exc:
            raise OptionError(f"Option {self.name!r} has an invalid value {shown}: {exc}.") from None
        if self.minimum is not None and value < self.minimum:
            raise OptionError(
                f"Option {self.name!r} has an invalid value {shown}: it must be at least {self.minimum:g}."
            )
        return value


CONNECTION_OPTIONS: tuple[Option, ...] = (
    Option("servers", parse_servers, ("nats://127.0.0.1:4222",), "Comma-separated NATS server URLs."),
    Option("creds", parse_text, None, "Path of a NATS credentials file (JWT and nkey seed)."),
    Option("nkey", parse_text, None, "Path of a file holding an nkey seed."),
    Option("token", parse_text, None, "Authentication token.", secret=True),
    Option("user", parse_text, None, "User name (with `password`)."),
    Option("password", parse_text, None, "Password (with `user`).", secret=True),
    Option("tls.ca", parse_text, None, "Path of the CA certificate that signed the server's certificate."),
    Option("tls.cert", parse_text, None, "Path of the client certificate for mutual TLS (with `tls.key`)."),
    Option("tls.key", parse_text, None, "Path of the client private key for mutual TLS."),
    Option("domain", parse_text, None, "JetStream domain, when the stream lives in another domain."),
    Option(
        "connectTimeout",
        parse_duration,
        5.0,
        "How long to try to reach a server before failing (e.g. `5s`).",
        minimum=0.1,
    ),
)

PULL_OPTIONS: tuple[Option, ...] = (
    Option("pullBatchSize", parse_int, 1000, "Messages asked for by one pull request.", minimum=1),
    Option("pullsInFlight", parse_int, 4, "Pull requests kept outstanding per member.", minimum=1),
    Option(
        "pullExpires",
        parse_pull_expires,
        5.0,
        "How long one pull request may wait at the server: under half the member consumers' `priority_timeout` "
        "(2 min), so at most 59s.",
        minimum=0.1,
    ),
    Option(
        "pullIdleHeartbeat",
        parse_duration,
        1.0,
        "Server heartbeat interval while a pull waits; at most half of `pullExpires`.",
        minimum=0.05,
    ),
    Option(
        "pullMaxBytes",
        parse_size,
        4 * 1024 * 1024,
        "Payload bytes asked for by one pull request (bounds executor memory; a larger message still arrives).",
        minimum=1024,
    ),
    Option("recordBatchSize", parse_int, 10_000, "Rows per Arrow record batch handed to Spark.", minimum=1),
)


def parse_options(raw: Mapping[str, str], allowed: Iterable[Option]) -> dict[str, Any]:
    """Check names against ``allowed`` (case-insensitively, as Spark does) and convert values."""
    by_lower = {option.name.lower(): option for option in allowed}
    values = {option.name: option.default for option in by_lower.values()}
    given = {key.lower() for key in raw}
    missing = [option.name for option in by_lower.values() if option.required and option.name.lower() not in given]
    if missing:
        raise OptionError(f"Option {missing[0]!r} is required: set it with .option({missing[0]!r}, ...).")
    for key, raw_value in raw.items():
        option = by_lower.get(key.lower())
        if option is None:
            names = [option.name for option in by_lower.values()]
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.5) or difflib.get_close_matches(
                key.lower(), list(by_lower), n=1, cutoff=0.5
            )
            hint = f" Did you mean {by_lower[close[0].lower()].name!r}?" if close else ""
            raise OptionError(f"Unknown option {key!r}.{hint} Valid options: {', '.join(sorted(names))}.")
        values[option.name] = option.convert(str(raw_value))
    for first, second in _EXCLUSIVE:
        if first.lower() in given and second.lower() in given:
            raise OptionError(f"Set {first} or {second}, not both.")
    _check_ranges(values)
    return values


_EXCLUSIVE = (("startingPosition", "startingTimestamp"), ("endingPosition", "endingTimestamp"))
"""Pairs of options that say the same thing two ways: a read takes one of each."""


def _check_ranges(values: Mapping[str, Any]) -> None:
    """A batch read's end must not come before its start (an empty read would hide the mistake)."""
    start, end = values.get("startingPosition"), values.get("endingPosition")
    if isinstance(start, int) and isinstance(end, int) and end < start:
        raise OptionError(
            f"endingPosition ({end}) is before startingPosition ({start}): a batch read covers the stream "
            "sequences from startingPosition up to and including endingPosition."
        )
    start, end = values.get("startingTimestamp"), values.get("endingTimestamp")
    if start is not None and end is not None and end <= start:
        raise OptionError(
            f"endingTimestamp ({end.isoformat()}) is not after startingTimestamp ({start.isoformat()}): a batch "
            "read covers the messages stored at or after startingTimestamp and before endingTimestamp."
        )


SOURCE_OPTIONS: tuple[Option, ...] = (
    Option("stream", parse_name, None, "The JetStream stream to read.", required=True),
    Option(
        "group",
        parse_name,
        None,
        "The partitioned consumer group; its member consumers are `<group>-<member>`.",
        required=True,
    ),
    Option(
        "members",
        parse_positive_int,
        None,
        "Members of a group derived from the stream's partition transform (default: one per partition).",
    ),
    Option(
        "startingPosition",
        parse_position,
        None,
        "Where a new query starts: `earliest`, `latest`, `group` (the member consumers' ack floor) or a "
        "stream sequence. Default: `group` when the member consumers exist, else `earliest`.",
    ),
    Option(
        "startingTimestamp",
        parse_timestamp,
        None,
        "Start at the first message stored at or after this time (ISO-8601 or epoch ms).",
    ),
    Option("maxMessagesPerTrigger", parse_positive_int, None, "At most this many messages per micro-batch."),
    Option(
        "maxBytesPerTrigger",
        parse_size,
        None,
        "About at most this many bytes per micro-batch (estimated from the stream's average message size).",
    ),
    Option(
        "minMessagesPerTrigger",
        parse_positive_int,
        None,
        "Wait for at least this many messages before a micro-batch (up to `maxTriggerDelay`).",
    ),
    Option(
        "maxTriggerDelay",
        parse_duration,
        15 * 60.0,
        "Longest wait for `minMessagesPerTrigger` before a smaller batch runs.",
        minimum=0,
    ),
    Option(
        "failOnDataLoss",
        parse_bool,
        True,
        "Fail when messages of a batch were removed before they were read (retention, purge); "
        "`false` skips them with a warning.",
    ),
    Option("includeHeaders", parse_bool, False, "Add the `headers` column."),
    Option(
        "ackWait",
        parse_duration,
        3600.0,
        "The member consumers' ack_wait: how long a delivered, uncommitted message waits before the "
        "server may redeliver it.",
        minimum=1,
    ),
    Option(
        "ackPolicy",
        parse_ack_policy,
        "explicit",
        "The member consumers' ack policy. `none` (Limits-retention streams only) spares the server tracking "
        "every delivered message until the commit, for about 1.3x faster reads from file-backed streams; the "
        "commit still sets every ack floor to the checkpoint, but while a batch is read the floor runs ahead "
        "of it (see Guarantees).",
    ),
)
"""Options of ``spark.readStream.format("jetstream")`` besides the connection and pull options."""

READER_OPTIONS = CONNECTION_OPTIONS + PULL_OPTIONS + SOURCE_OPTIONS


BATCH_READ_OPTIONS: tuple[Option, ...] = (
    Option("stream", parse_name, None, "The JetStream stream to read.", required=True),
    Option(
        "group",
        parse_name,
        None,
        "Optional: read what this group reads (its work stream, its members' filter subjects), without "
        "touching its consumers. Default: the whole stream.",
    ),
    Option("members", parse_positive_int, None, "With `group`: as for streaming reads."),
    Option(
        "startingPosition",
        parse_position,
        None,
        "First message: `earliest` (default), `latest`, `group` (after the group's ack floor) or a stream sequence.",
    ),
    Option("startingTimestamp", parse_timestamp, None, "Start at the first message stored at or after this time."),
    Option(
        "endingPosition",
        parse_end_position,
        "latest",
        "Last message: `latest` (the stream's last sequence when the query is planned) or a stream sequence "
        "(inclusive).",
    ),
    Option("endingTimestamp", parse_timestamp, None, "Stop before the first message stored at or after this time."),
    Option(
        "failOnDataLoss",
        parse_bool,
        True,
        "Fail when messages from `startingPosition` on were already removed; `false` reads what is left.",
    ),
    Option("includeHeaders", parse_bool, False, "Add the `headers` column."),
    Option(
        "maxRangePerPartition",
        parse_positive_int,
        1_000_000,
        "Most stream sequences one Spark partition covers; longer ranges are split into more partitions.",
    ),
    Option("directGetBatch", parse_positive_int, 10_000, "Messages asked for by one Direct Get request.", minimum=1),
    Option("recordBatchSize", parse_int, 10_000, "Rows per Arrow record batch handed to Spark.", minimum=1),
)
"""Options of ``spark.read.format("jetstream")`` besides the connection options."""

BATCH_READER_OPTIONS = CONNECTION_OPTIONS + BATCH_READ_OPTIONS

_OPTIONAL_GROUP = Option("group", parse_name, None, "The consumer group.")
LOAD_OPTIONS: tuple[Option, ...] = tuple(
    {option.name: option for option in (*READER_OPTIONS, *BATCH_READER_OPTIONS, _OPTIONAL_GROUP)}.values()
)
"""What ``load()`` accepts: streaming or batch read options (Spark does not say which is coming)."""

SINK_OPTIONS: tuple[Option, ...] = (
    Option("subject", parse_subject, None, "Subject of rows without a `subject` column, or whose `subject` is null."),
    Option(
        "deduplicate",
        parse_bool,
        True,
        "Give every message a `Nats-Msg-Id` (the row's `msg_id`, else one derived from the query, batch, "
        "partition and row), so a replayed batch or retried task is stored once (within the stream's duplicate "
        "window); `false` is faster, but a replay or retry stores its messages again.",
    ),
    Option(
        "expectedStream",
        parse_name,
        None,
        "Every message must be stored by this stream (`Nats-Expected-Stream`); otherwise the write fails.",
    ),
    Option(
        "commitBucket",
        parse_name,
        "spark-jetstream-commits",
        "KV bucket of the streaming writer's committed-batch markers; created when missing.",
    ),
    Option("commitBucketReplicas", parse_positive_int, 1, "Replicas of `commitBucket` when the writer creates it."),
    Option("publishWindow", parse_int, 4000, "Messages a task publishes ahead of their PubAcks.", minimum=2),
    Option(
        "publishTimeout",
        parse_duration,
        30.0,
        "How long a task waits for outstanding PubAcks before it fails.",
        minimum=0.1,
    ),
)
"""Options of ``df.write``/``df.writeStream`` ``.format("jetstream")`` besides the connection options."""

WRITER_OPTIONS = CONNECTION_OPTIONS + SINK_OPTIONS

SPARK_WRITE_OPTIONS = frozenset({"checkpointlocation"})
"""Options Spark itself adds to a streaming writer's options: not ours to check."""


def _default_text(option: Option) -> str:
    default = option.default
    if default is None:
        return "required" if option.required else "-"
    if isinstance(default, tuple):
        return ",".join(default)
    if option.parse in (parse_duration, parse_pull_expires):
        return f"{default:g}s"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


def _table(options: Iterable[Option]) -> list[str]:
    lines = ["| option | default | meaning |", "|---|---|---|"]
    for option in options:
        lines.append(f"| `{option.name}` | {_default_text(option)} | {option.doc} |")
    return lines


def options_markdown() -> str:
    """The README's option tables, generated from the definitions above."""
    return "\n".join(
        [
            'Streaming reads, `spark.readStream.format("jetstream")`:',
            "",
            *_table(READER_OPTIONS),
            "",
            'Batch reads, `spark.read.format("jetstream")`: the connection options (`servers` to `connectTimeout`) and',
            "",
            *_table(BATCH_READ_OPTIONS),
            "",
            'Writes, `df.write.format("jetstream")` and `df.writeStream.format("jetstream")`: the connection '
            "options and",
            "",
            *_table(SINK_OPTIONS),
        ]
    )
