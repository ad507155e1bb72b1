"""Every option, defined once: its name, type, default, documentation, the config attribute it fills and
the modes (streaming read, batch read, write) it belongs to.

Spark hands options over as strings in a case-insensitive map. ``parse_options`` turns them into
typed values for one mode, refusing unknown names (suggesting the closest valid one), options of
another mode (saying where they belong), malformed values (naming the option and the expected form)
and inconsistent combinations. The config dataclasses (``SourceConfig``, ``BatchConfig``,
``SinkConfig``, ``PullSettings``, ``ConnectionOptions``) take their defaults and values from these
definitions (``default_of``, ``config_values``), the command line builds its connection flags from
them, and the README's option tables are generated from them, so code and docs cannot drift apart.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import OptionError
from .option_parsers import (
    ACK_POLICIES,
    DEFAULT_PRIORITY_TIMEOUT,
    SUBJECT_PATTERN,
    parse_ack_policy,
    parse_bool,
    parse_duration,
    parse_end_position,
    parse_int,
    parse_name,
    parse_position,
    parse_positive_int,
    parse_pull_expires,
    parse_servers,
    parse_size,
    parse_subject,
    parse_text,
    parse_timestamp,
)

__all__ = [
    "ACK_POLICIES",
    "DEFAULT_PRIORITY_TIMEOUT",
    "SUBJECT_PATTERN",
    "Option",
    "config_values",
    "default_of",
    "options_markdown",
    "parse_duration",
    "parse_options",
]

STREAM, BATCH, WRITE = "readStream", "read", "write"
"""The modes: ``spark.readStream``, ``spark.read``, ``df.write``/``df.writeStream``."""
READ = frozenset({STREAM, BATCH})
ALL = frozenset({STREAM, BATCH, WRITE})
LOAD = READ
"""What ``load()`` checks: Spark does not say yet whether a streaming or a batch read is coming."""


@dataclass(frozen=True)
class Option:
    """One user-facing option.

    ``attr`` is the field it fills in a config dataclass (default: the name in snake_case); ``part``
    groups it in the docs (``connection``, ``pull``, ``read``, ``sink``); ``required`` lists the
    modes that need it; ``batch_doc`` replaces ``doc`` where batch reads mean something else by it.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    modes: frozenset[str]
    part: str
    attr: str = ""
    secret: bool = False
    minimum: float | None = None
    required: frozenset[str] = frozenset()
    batch_doc: str | None = None

    def __post_init__(self) -> None:
        if not self.attr:
            snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in self.name.replace(".", "_"))
            object.__setattr__(self, "attr", snake)

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

    def doc_for(self, mode: str) -> str:
        return self.batch_doc if mode == BATCH and self.batch_doc else self.doc


def _connection(name: str, parse: Callable[[str], Any], default: Any, doc: str, **extra: Any) -> Option:
    return Option(name, parse, default, doc, ALL, "connection", **extra)


OPTIONS: tuple[Option, ...] = (
    _connection("servers", parse_servers, ("nats://127.0.0.1:4222",), "Comma-separated NATS server URLs."),
    _connection("creds", parse_text, None, "Path of a NATS credentials file (JWT and nkey seed)."),
    _connection("nkey", parse_text, None, "Path of a file holding an nkey seed."),
    _connection("token", parse_text, None, "Authentication token.", secret=True),
    _connection("user", parse_text, None, "User name (with `password`)."),
    _connection("password", parse_text, None, "Password (with `user`).", secret=True),
    _connection("tls.ca", parse_text, None, "Path of the CA certificate that signed the server's certificate."),
    _connection("tls.cert", parse_text, None, "Path of the client certificate for mutual TLS (with `tls.key`)."),
    _connection("tls.key", parse_text, None, "Path of the client private key for mutual TLS."),
    _connection("domain", parse_text, None, "JetStream domain, when the stream lives in another domain."),
    _connection(
        "connectTimeout",
        parse_duration,
        5.0,
        "How long to try to reach a server before failing (e.g. `5s`).",
        minimum=0.1,
    ),
    Option(
        "pullBatchSize",
        parse_int,
        1000,
        "Messages asked for by one pull request.",
        frozenset({STREAM}),
        "pull",
        attr="batch",
        minimum=1,
    ),
    Option(
        "pullsInFlight",
        parse_int,
        4,
        "Pull requests kept outstanding per member.",
        frozenset({STREAM}),
        "pull",
        attr="in_flight",
        minimum=1,
    ),
    Option(
        "pullExpires",
        parse_pull_expires,
        5.0,
        "How long one pull request may wait at the server: under half the member consumers' `priority_timeout` "
        "(2 min), so at most 59s.",
        frozenset({STREAM}),
        "pull",
        attr="expires",
        minimum=0.1,
    ),
    Option(
        "pullIdleHeartbeat",
        parse_duration,
        1.0,
        "Server heartbeat interval while a pull waits; at most half of `pullExpires` (the default drops to half "
        "of a `pullExpires` under 2s).",
        frozenset({STREAM}),
        "pull",
        attr="idle_heartbeat",
        minimum=0.05,
    ),
    Option(
        "pullMaxBytes",
        parse_size,
        4 * 1024 * 1024,
        "Payload bytes asked for by one pull request (bounds executor memory; a larger message still arrives).",
        frozenset({STREAM}),
        "pull",
        attr="max_bytes",
        minimum=1024,
    ),
    Option(
        "recordBatchSize",
        parse_int,
        10_000,
        "Rows per Arrow record batch handed to Spark.",
        READ,
        "pull",
        minimum=1,
    ),
    Option(
        "stream",
        parse_name,
        None,
        "The JetStream stream to read.",
        READ,
        "read",
        required=READ,
    ),
    Option(
        "group",
        parse_name,
        None,
        "The partitioned consumer group; its member consumers are `<group>-<member>`.",
        READ,
        "read",
        required=frozenset({STREAM}),
        batch_doc="Optional: read what this group reads (its work stream, its members' filter subjects), without "
        "touching its consumers. Default: the whole stream.",
    ),
    Option(
        "members",
        parse_positive_int,
        None,
        "Members of a group derived from the stream's partition transform (default: one per partition).",
        READ,
        "read",
        batch_doc="With `group`: as for streaming reads.",
    ),
    Option(
        "startingPosition",
        parse_position,
        None,
        "Where a new query starts: `earliest`, `latest`, `group` (the member consumers' ack floor) or a "
        "stream sequence. Default: `group` when the member consumers exist, else `earliest`.",
        READ,
        "read",
        batch_doc="First message: `earliest` (default), `latest`, `group` (after the group's ack floor) or a stream "
        "sequence.",
    ),
    Option(
        "startingTimestamp",
        parse_timestamp,
        None,
        "Start at the first message stored at or after this time (ISO-8601 or epoch ms).",
        READ,
        "read",
        batch_doc="Start at the first message stored at or after this time.",
    ),
    Option(
        "maxMessagesPerTrigger",
        parse_positive_int,
        None,
        "At most this many messages per micro-batch.",
        frozenset({STREAM}),
        "read",
        attr="max_messages",
    ),
    Option(
        "maxBytesPerTrigger",
        parse_size,
        None,
        "About at most this many bytes per micro-batch (estimated from the stream's average message size).",
        frozenset({STREAM}),
        "read",
        attr="max_bytes_per_trigger",
    ),
    Option(
        "minMessagesPerTrigger",
        parse_positive_int,
        None,
        "Wait for at least this many messages before a micro-batch (up to `maxTriggerDelay`).",
        frozenset({STREAM}),
        "read",
        attr="min_messages",
    ),
    Option(
        "maxTriggerDelay",
        parse_duration,
        15 * 60.0,
        "Longest wait for `minMessagesPerTrigger` before a smaller batch runs.",
        frozenset({STREAM}),
        "read",
        minimum=0,
    ),
    Option(
        "endingPosition",
        parse_end_position,
        "latest",
        "Last message: `latest` (the stream's last sequence when the query is planned) or a stream sequence "
        "(inclusive).",
        frozenset({BATCH}),
        "read",
    ),
    Option(
        "endingTimestamp",
        parse_timestamp,
        None,
        "Stop before the first message stored at or after this time.",
        frozenset({BATCH}),
        "read",
    ),
    Option(
        "failOnDataLoss",
        parse_bool,
        True,
        "Fail when messages of a batch were removed before they were read (retention, purge); "
        "`false` skips them with a warning.",
        READ,
        "read",
        batch_doc="Fail when messages from `startingPosition` on were already removed; `false` reads what is left.",
    ),
    Option("includeHeaders", parse_bool, False, "Add the `headers` column.", READ, "read"),
    Option(
        "ackWait",
        parse_duration,
        3600.0,
        "The member consumers' ack_wait: how long a delivered, uncommitted message waits before the "
        "server may redeliver it.",
        frozenset({STREAM}),
        "read",
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
        frozenset({STREAM}),
        "read",
    ),
    Option(
        "maxRangePerPartition",
        parse_positive_int,
        1_000_000,
        "Most stream sequences one Spark partition covers; longer ranges are split into more partitions.",
        frozenset({BATCH}),
        "read",
        attr="max_range",
    ),
    Option(
        "directGetBatch",
        parse_positive_int,
        10_000,
        "Messages asked for by one Direct Get request.",
        READ,
        "read",
        attr="direct_batch",
        minimum=1,
    ),
    Option(
        "subject",
        parse_subject,
        None,
        "Subject of rows without a `subject` column, or whose `subject` is null.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "deduplicate",
        parse_bool,
        True,
        "Give every message a `Nats-Msg-Id` (the row's `msg_id`, else one derived from the query, batch, "
        "partition and row), so a replayed batch or retried task is stored once (within the stream's duplicate "
        "window); `false` is faster, but a replay or retry stores its messages again.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "expectedStream",
        parse_name,
        None,
        "Every message must be stored by this stream (`Nats-Expected-Stream`); otherwise the write fails.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "commitBucket",
        parse_name,
        "spark-jetstream-commits",
        "KV bucket of the streaming writer's committed-batch markers; created when missing.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "commitBucketReplicas",
        parse_positive_int,
        1,
        "Replicas of `commitBucket` when the writer creates it.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "publishWindow",
        parse_int,
        4000,
        "Messages a task publishes ahead of their PubAcks.",
        frozenset({WRITE}),
        "sink",
        attr="window",
        minimum=2,
    ),
    Option(
        "publishTimeout",
        parse_duration,
        30.0,
        "How long a task waits for outstanding PubAcks before it fails.",
        frozenset({WRITE}),
        "sink",
        attr="timeout",
        minimum=0.1,
    ),
)

_BY_NAME = {option.name: option for option in OPTIONS}
_BY_ATTR = {option.attr: option for option in OPTIONS}
assert len(_BY_ATTR) == len(OPTIONS), "two options fill the same config attribute"


def options_for(modes: str | Iterable[str]) -> tuple[Option, ...]:
    """The options of ``modes`` (a mode or several), in definition order."""
    wanted = {modes} if isinstance(modes, str) else set(modes)
    return tuple(option for option in OPTIONS if option.modes & wanted)


CONNECTION_OPTIONS = tuple(option for option in OPTIONS if option.part == "connection")
PULL_OPTIONS = tuple(option for option in OPTIONS if option.part == "pull")
READER_OPTIONS = options_for(STREAM)
BATCH_READER_OPTIONS = options_for(BATCH)
WRITER_OPTIONS = options_for(WRITE)

SPARK_WRITE_OPTIONS = frozenset({"checkpointlocation"})
"""Options Spark itself adds to a streaming writer's options: not ours to check."""

_WRONG_MODE = {
    BATCH: "applies to spark.readStream only: a batch read has no micro-batches or member consumers. Remove it "
    "from spark.read.",
    STREAM: "applies to spark.read only: a streaming query has no end. Use trigger(availableNow=True) to stop at "
    "the messages there are when it starts.",
}
"""What an option of the other read mode is told, by the mode it was given to."""


def default_of(name: str) -> Any:
    """The default of option ``name``: config dataclasses take their field defaults from here."""
    return _BY_NAME[name].default


def config_values(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of config dataclass ``cls`` among parsed option ``values`` (by ``Option.attr``)."""
    by_attr = {_BY_NAME[name].attr: value for name, value in values.items() if name in _BY_NAME}
    return {f.name: by_attr[f.name] for f in fields(cls) if f.name in by_attr}


def parse_options(raw: Mapping[str, str], allowed: str | frozenset[str] | Iterable[Option]) -> dict[str, Any]:
    """Check names against ``allowed`` (a mode, a set of modes, or the options themselves; case-insensitively,
    as Spark does) and convert values; then the rules between options."""
    if isinstance(allowed, str):
        allowed = frozenset({allowed})
    modes: frozenset[str] = allowed if isinstance(allowed, frozenset) else frozenset()
    options = options_for(modes) if modes else tuple(allowed)  # type: ignore[arg-type]
    by_lower = {option.name.lower(): option for option in options}
    if WRITE in modes:
        raw = {key: value for key, value in raw.items() if key.lower() not in SPARK_WRITE_OPTIONS}
    if len(modes) == 1 and (mode := next(iter(modes))) in _WRONG_MODE:
        for key in raw:
            other = next((o for o in OPTIONS if o.name.lower() == key.lower() and o.modes & READ), None)
            if other is not None and key.lower() not in by_lower:
                raise OptionError(f"Option {other.name!r} {_WRONG_MODE[mode]}")
    values = {option.name: option.default for option in by_lower.values()}
    given = {key.lower() for key in raw}
    missing = [
        option.name for option in by_lower.values() if option.name.lower() not in given and _required(option, modes)
    ]
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
    _check_combinations(values, given)
    return values


def _required(option: Option, modes: frozenset[str]) -> bool:
    """Required in every mode asked for (``load()`` asks for both reads: ``group`` is optional in one)."""
    if not modes:
        return bool(option.required)
    return bool(option.required) and modes <= option.required


_EXCLUSIVE = (("startingPosition", "startingTimestamp"), ("endingPosition", "endingTimestamp"))
"""Pairs of options that say the same thing two ways: a read takes one of each."""


def _check_combinations(values: dict[str, Any], given: set[str]) -> None:
    """The rules between options. A pull heartbeat must fit twice into the pull's expiry (the server
    refuses it otherwise): an explicit one that does not is refused, the default drops to half."""
    for first, second in _EXCLUSIVE:
        if first.lower() in given and second.lower() in given:
            raise OptionError(f"Set {first} or {second}, not both.")
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
    expires, heartbeat = values.get("pullExpires"), values.get("pullIdleHeartbeat")
    if expires is not None and heartbeat is not None and heartbeat > expires / 2:
        if "pullidleheartbeat" in given:
            raise OptionError(
                f"Option 'pullIdleHeartbeat' has an invalid value: {heartbeat:g}s is more than half of pullExpires "
                f"({expires:g}s), and the server refuses such pulls. Use at most {expires / 2:g}s, or leave it unset."
            )
        values["pullIdleHeartbeat"] = expires / 2


def _default_text(option: Option, mode: str) -> str:
    default = option.default
    if default is None:
        return "required" if mode in option.required else "-"
    if isinstance(default, tuple):
        return ",".join(default)
    if option.parse in (parse_duration, parse_pull_expires):
        return f"{default:g}s"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


def _table(options: Iterable[Option], mode: str) -> list[str]:
    lines = ["| option | default | meaning |", "|---|---|---|"]
    for option in options:
        lines.append(f"| `{option.name}` | {_default_text(option, mode)} | {option.doc_for(mode)} |")
    return lines


def options_markdown() -> str:
    """The README's option tables, generated from the definitions above."""
    batch = [option for option in BATCH_READER_OPTIONS if option.part != "connection"]
    sink = [option for option in WRITER_OPTIONS if option.part != "connection"]
    return "\n".join(
        [
            'Streaming reads, `spark.readStream.format("jetstream")`:',
            "",
            *_table(READER_OPTIONS, STREAM),
            "",
            'Batch reads, `spark.read.format("jetstream")`: the connection options (`servers` to `connectTimeout`) and',
            "",
            *_table(batch, BATCH),
            "",
            'Writes, `df.write.format("jetstream")` and `df.writeStream.format("jetstream")`: the connection '
            "options and",
            "",
            *_table(sink, WRITE),
        ]
    )
