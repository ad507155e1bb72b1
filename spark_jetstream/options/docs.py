"""The option reference (``options_markdown``), generated from the option definitions so code and docs cannot drift
apart (``tests/test_docs.py`` compares them): one table per part, as the definitions are organised (connection,
reads, consumer groups, writes), each option with its type and format, default, modes, Kafka's equivalent and
meaning; then Spark's Kafka option names and what each is here (``options/kafka.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from spark_jetstream.options.connection import CONNECTION
from spark_jetstream.options.groups import GROUPS
from spark_jetstream.options.kafka import KAFKA_OPTIONS, kafka_names_of
from spark_jetstream.options.option import BATCH, STREAM, WRITE, Option
from spark_jetstream.options.parsers import parse_duration, parse_size
from spark_jetstream.options.reads import READS
from spark_jetstream.options.writes import WRITES

_PARTS: tuple[tuple[str, str, tuple[Option, ...]], ...] = (
    (
        "Connection",
        "Every read and write takes them: `spark.readStream`, `spark.read`, `df.write` and `df.writeStream` with "
        '`format("jetstream")`.',
        CONNECTION,
    ),
    (
        "Reading",
        'What `spark.readStream.format("jetstream")` (streaming) and `spark.read.format("jetstream")` (batch) read, '
        "from where to where, how fast, and how it is split into Spark partitions.",
        READS,
    ),
    (
        "Consumer groups",
        "A read through a consumer group: the group, and how its member consumers are configured and pulled from. "
        + "Refused without `group`: "
        + ", ".join(f"`{option.name}`" for option in GROUPS if option.group_only)
        + ".",
        GROUPS,
    ),
    (
        "Writing",
        'Where `df.write.format("jetstream")` and `df.writeStream.format("jetstream")` put rows, and how '
        "exactly-once is kept.",
        WRITES,
    ),
)
"""The parts of the reference, in the order of the definitions (``options/definitions.py``)."""

_PREFIX = "a subject without wildcards, such as `JS.OWNER.API` or `_INBOX.spark-team` (a trailing `.>` is dropped)"
_TYPES: dict[str, tuple[str, str]] = {
    "parse_duration": ("duration", "`500ms`, `5s`, `2m` (two minutes), `1h`, or a bare number of seconds"),
    "parse_size": (
        "size",
        "bytes, or `512k`, `64m` (64 MiB), `1g`: in a size `2m` is 2 MiB, in a duration two minutes",
    ),
    "parse_int": ("integer", "a whole number (`10000` or `10_000`)"),
    "parse_positive_int": ("integer", "a whole number (`10000` or `10_000`)"),
    "parse_bool": ("boolean", "`true` or `false` (also `yes`/`no`, `1`/`0`)"),
    "parse_timestamp": (
        "timestamp",
        "an ISO-8601 time (`2026-01-31T12:00:00Z`; UTC when it names no zone) or milliseconds since the epoch",
    ),
    "parse_name": ("name", "letters, digits, `-` and `_`"),
    "parse_subject": ("subject", "a subject without wildcards, such as `orders.eu.new`"),
    "parse_subject_filters": (
        "subject filters",
        "comma-separated subjects with `*` (one token) and `>` (the rest) wildcards, no two matching the same "
        "subject, such as `orders.eu.>,orders.*.new`",
    ),
    "parse_servers": (
        "server URLs",
        "comma-separated `nats://host:port` (also `tls://`, `ws://`, `wss://`, or `host:port`; port 4222 when none "
        "is given)",
    ),
    "parse_api_prefix": ("subject prefix", _PREFIX),
    "parse_inbox_prefix": ("subject prefix", _PREFIX),
    "parse_text": ("text", "any text that is not empty"),
    "parse_position": (
        "start position",
        "`earliest`, `latest`, `group`, `snapshot` (a KV bucket) or a stream sequence (from 1)",
    ),
    "parse_end_position": ("end position", "`latest` or a stream sequence (inclusive)"),
    "parse_read_mode": ("`auto`, `direct` or `pull`", ""),
    "parse_ack_policy": ("`explicit` or `none`", ""),
}
"""Each value parser's type, as the tables name it, and its format, as the legend gives it."""

_MODES = {STREAM: "readStream", BATCH: "read", WRITE: "write"}


def _type_of(option: Option) -> tuple[str, str]:
    name = getattr(option.parse, "__name__", repr(option.parse))
    if name not in _TYPES:
        raise KeyError(f"option {option.name!r}: give its parser {name} a type and format in options/docs.py _TYPES")
    return _TYPES[name]


def _value_text(option: Option, value: float) -> str:
    if option.parse is parse_duration:
        return f"{value:g}s"
    if option.parse is parse_size:
        return _size_text(int(value))
    return f"{value:,g}"


def _type_text(option: Option) -> str:
    text = _type_of(option)[0]
    if option.minimum is not None and option.maximum is not None:
        return f"{text}, {_value_text(option, option.minimum)} to {_value_text(option, option.maximum)}"
    if option.minimum is not None:
        return f"{text} ≥ {_value_text(option, option.minimum)}"
    if option.parse.__name__ == "parse_positive_int":
        return f"{text} ≥ 1"
    return text


def _default_text(option: Option) -> str:
    default = option.default
    if default is None:
        return "required" if option.required else "-"
    if isinstance(default, tuple):
        return ",".join(default)
    if option.parse is parse_duration:
        return f"{default:g}s"
    if isinstance(default, bool):
        return str(default).lower()
    if option.parse is parse_size:
        return _size_text(default)
    return str(default)


def _size_text(size: int) -> str:
    """A size as ``parse_size`` reads it, in the largest unit that divides it (``16m``)."""
    for unit, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def _meaning(option: Option) -> str:
    """The option's documentation; where batch reads or writes mean something else by it, each mode's."""
    if not option.batch_doc and not option.write_doc:
        return option.doc
    parts = []
    if STREAM in option.modes or not option.batch_doc:
        parts.append(f"*{'Streaming' if option.batch_doc else 'Reads'}:* {option.doc}")
    if option.batch_doc:
        parts.append(f"*Batch:* {option.batch_doc}")
    if option.write_doc:
        parts.append(f"*Writes:* {option.write_doc}")
    return " ".join(parts)


def _modes_text(option: Option) -> str:
    return ", ".join(f"`{_MODES[mode]}`" for mode in (STREAM, BATCH, WRITE) if mode in option.modes)


def _kafka_text(option: Option) -> str:
    return ", ".join(f"`{name}`" for name in kafka_names_of(option.name)) or "-"


def _table(options: Sequence[Option]) -> list[str]:
    with_modes = len({option.modes for option in options}) > 1
    header = ["option", "type", "default", *(["in"] if with_modes else []), "Kafka", "meaning"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for option in options:
        cells = [f"`{option.name}`", _type_text(option), _default_text(option)]
        if with_modes:
            cells.append(_modes_text(option))
        cells += [_kafka_text(option), _meaning(option)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _legend() -> list[str]:
    """The formats of the types the tables use, in ``_TYPES`` order (durations and sizes first)."""
    used = {_type_of(option)[0] for _, _, options in _PARTS for option in options}
    forms = {label: form for label, form in _TYPES.values() if form and label in used}
    return [f"- **{label}**: {form}" for label, form in forms.items()]


def options_markdown() -> str:
    """The option reference: the text between the ``options-table`` markers in the docs."""
    lines = [
        "Option names are case-insensitive, as Spark's are; values are text. The type column names how a value "
        "is read:",
        "",
        *_legend(),
        "",
        "The column `in` says which of `spark.readStream` (`readStream`), `spark.read` (`read`) and "
        "`df.write`/`df.writeStream` (`write`) take an option; the column Kafka names the options of Spark's Kafka "
        "source and sink that do the same or the nearest thing (see the last table for what differs).",
    ]
    for title, intro, options in _PARTS:
        lines += ["", f"## {title}", "", intro, "", *_table(options)]
    lines += [
        "",
        "## Spark's Kafka options",
        "",
        'Given to `format("jetstream")`, a name that is not an option here is refused with its sentence below.',
        "",
        "| Kafka option | here |",
        "|---|---|",
        *(f"| `{kafka.name}` | {kafka.sentence} |" for kafka in KAFKA_OPTIONS),
        "| `kafka.*` (client settings) | No equivalent: a connection takes `servers`, `creds`, `nkey`, `token`, "
        "`user` and `password`, and `tls.*`. |",
    ]
    return "\n".join(lines)
