"""Spark's Kafka source and sink option names, and what each is here: defined once, for the error an unknown
option gets (``parse_options``) and for the option tables' Kafka column (``options_markdown``).

Each sentence is Markdown (option names in backticks); an error shows the names in quotes instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KafkaOption:
    """Spark's Kafka option ``name``, this connector's nearest option ``ours`` (``None``: no equivalent) and the
    sentence that says so."""

    name: str
    ours: str | None
    sentence: str


KAFKA_OPTIONS: tuple[KafkaOption, ...] = (
    KafkaOption(
        "kafka.bootstrap.servers",
        "servers",
        "Kafka's `kafka.bootstrap.servers` is `servers` here: comma-separated NATS server URLs such as "
        "`nats://host:4222`.",
    ),
    KafkaOption(
        "subscribe",
        "stream",
        "Kafka's `subscribe` is `stream` here: a read names one JetStream stream, and `subjects` narrows it to some "
        "of its subjects.",
    ),
    KafkaOption(
        "subscribePattern",
        "subjects",
        "Kafka's `subscribePattern` is closest to `subjects` here: NATS wildcards (`*` for one token, `>` for the "
        "rest) over the subjects of one `stream`, not a regular expression over topic names.",
    ),
    KafkaOption(
        "assign",
        None,
        "Kafka's `assign` has no equivalent: a read takes a whole `stream`, the subjects `subjects` selects, or what "
        "the member consumers of a `group` select.",
    ),
    KafkaOption(
        "startingOffsets",
        "startingPosition",
        "Kafka's `startingOffsets` is `startingPosition` here: `earliest`, `latest`, `group` or one stream sequence "
        "(no JSON per partition). A streaming read starts at `earliest` by default (at `group` when the group's "
        "member consumers exist), where Kafka's starts at `latest`.",
    ),
    KafkaOption(
        "startingTimestamp",
        "startingTimestamp",
        "Kafka's `startingTimestamp` has the same name here: the first message stored at or after that time (ISO-8601 "
        "or epoch milliseconds).",
    ),
    KafkaOption(
        "startingOffsetsByTimestamp",
        "startingTimestamp",
        "Kafka's `startingOffsetsByTimestamp` is `startingTimestamp` here: one time for the whole stream, not one per "
        "partition.",
    ),
    KafkaOption(
        "startingOffsetsByTimestampStrategy",
        None,
        "Kafka's `startingOffsetsByTimestampStrategy` has no equivalent: `startingTimestamp` starts at the first "
        "message stored at or after that time.",
    ),
    KafkaOption(
        "endingOffsets",
        "endingPosition",
        "Kafka's `endingOffsets` is `endingPosition` here (batch reads), and it is inclusive: the last stream "
        "sequence read, where Kafka's ending offset is the first one not read.",
    ),
    KafkaOption(
        "endingTimestamp",
        "endingTimestamp",
        "Kafka's `endingTimestamp` has the same name here (batch reads): the read stops before the first message "
        "stored at or after that time.",
    ),
    KafkaOption(
        "endingOffsetsByTimestamp",
        "endingTimestamp",
        "Kafka's `endingOffsetsByTimestamp` is `endingTimestamp` here (batch reads): one time for the whole stream, "
        "not one per partition.",
    ),
    KafkaOption(
        "maxOffsetsPerTrigger",
        "maxMessagesPerTrigger",
        "Kafka's `maxOffsetsPerTrigger` is `maxMessagesPerTrigger` here.",
    ),
    KafkaOption(
        "minOffsetsPerTrigger",
        "minMessagesPerTrigger",
        "Kafka's `minOffsetsPerTrigger` is `minMessagesPerTrigger` here, bounded by `maxTriggerDelay` as in Kafka.",
    ),
    KafkaOption(
        "maxTriggerDelay",
        "maxTriggerDelay",
        "Kafka's `maxTriggerDelay` has the same name here, with the same default (15 minutes).",
    ),
    KafkaOption(
        "minPartitions",
        "minPartitions",
        "Kafka's `minPartitions` has the same name here: the widest ranges are cut into more Spark partitions.",
    ),
    KafkaOption(
        "maxRecordsPerPartition",
        "maxRangePerPartition",
        "Kafka's `maxRecordsPerPartition` is `maxRangePerPartition` here for batch reads (stream sequences per Spark "
        "partition); a streaming read has no equivalent: raise `minPartitions` to cut its batches finer.",
    ),
    KafkaOption(
        "failOnDataLoss",
        "failOnDataLoss",
        "Kafka's `failOnDataLoss` has the same name here, with the same default (`true`).",
    ),
    KafkaOption(
        "includeHeaders",
        "includeHeaders",
        "Kafka's `includeHeaders` has the same name here, but the `headers` column is a map from header name to a "
        "list of string values, where Kafka's is an array of (key, binary value) structs.",
    ),
    KafkaOption(
        "groupIdPrefix",
        None,
        "Kafka's `groupIdPrefix` has no equivalent: Spark's Kafka source names consumer groups that keep no "
        "position; here `group` names a consumer group whose member consumers hold the query's position.",
    ),
    KafkaOption(
        "kafka.group.id",
        "group",
        "Kafka's `kafka.group.id` is closest to `group` here: a partitioned consumer group whose member consumers' "
        "ack floors move to the checkpoint at every commit, which Kafka's source never does with its group's offsets.",
    ),
    KafkaOption(
        "topic",
        "subject",
        "Kafka's `topic` is `subject` here (writes): the subject of rows without a `subject` column; the stream "
        "whose subjects match it stores them.",
    ),
)
"""Spark's Kafka options (Spark 4 Structured Streaming + Kafka guide) and what each is here."""

_BY_LOWER = {kafka.name.lower(): kafka for kafka in KAFKA_OPTIONS}


def kafka_sentence(name: str) -> str | None:
    """What Spark's Kafka option ``name`` (any case) is here, in Markdown, or ``None`` for a name Kafka's source and
    sink do not take. Any other ``kafka.*`` name is a Kafka client setting, which has no equivalent."""
    kafka = _BY_LOWER.get(name.lower())
    if kafka is not None:
        return kafka.sentence
    if name.lower().startswith("kafka."):
        return (
            f"Kafka's client setting `{name}` has no equivalent: a connection takes `servers`, `creds`, `nkey`, "
            "`token`, `user` and `password`, and `tls.*`."
        )
    return None


def kafka_names_of(option: str) -> tuple[str, ...]:
    """Spark's Kafka options whose nearest equivalent here is ``option``."""
    return tuple(kafka.name for kafka in KAFKA_OPTIONS if kafka.ours == option)
