"""The reader's configuration: user option strings parsed once into one typed, validated object.

Light on purpose (no NATS client, no pyarrow): Spark's planner process and every executor worker
unpickle it before the first batch, and the planner needs nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from spark_jetstream.client.connection_options import ConnectionOptions
from spark_jetstream.options import STREAM, config_values, connection_options, default_of, parse_options
from spark_jetstream.read.kv import bucket_read


@dataclass(frozen=True)
class PullSettings:
    """Pull tuning (options ``pullBatchSize``, ``pullsInFlight``, ``pullExpires``, ...)."""

    batch: int = default_of("pullBatchSize")
    in_flight: int = default_of("pullsInFlight")
    expires: float = default_of("pullExpires")
    idle_heartbeat: float = default_of("pullIdleHeartbeat")  # parse_options keeps it at most expires / 2
    record_batch_size: int = default_of("recordBatchSize")
    max_bytes: int = default_of("pullMaxBytes")
    record_batch_bytes: int = default_of("recordBatchBytes")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> PullSettings:
        return cls(**config_values(cls, options))


@dataclass(frozen=True)
class SourceConfig:
    """Everything ``spark.readStream.format("jetstream")`` was told. Picklable; secrets stay out of repr.

    Field defaults and the option each field comes from are in ``options.OPTIONS``.
    """

    connection: ConnectionOptions
    pull: PullSettings
    stream: str
    group: str | None = None
    subjects: tuple[str, ...] | None = None
    members: int | None = None
    starting_position: str | int | None = None
    starting_timestamp: datetime | None = None
    max_messages: int | None = None
    max_bytes_per_trigger: int | None = None
    min_messages: int | None = None
    max_trigger_delay: float = default_of("maxTriggerDelay")
    idle_interval: float = default_of("idleInterval")
    fail_on_data_loss: bool = default_of("failOnDataLoss")
    include_headers: bool = default_of("includeHeaders")
    ack_wait: float = default_of("ackWait")
    ack_policy: str = default_of("ackPolicy")
    priority_timeout: float = default_of("priorityTimeout")
    direct_batch: int = default_of("directGetBatch")
    direct_max_bytes: int = default_of("directGetMaxBytes")
    read_mode: str = default_of("readMode")
    min_partitions: int | None = None
    preserve_order: bool = default_of("preservePartitionOrder")
    bucket: str | None = None
    keys: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SourceConfig:
        values = bucket_read(parse_options(raw, STREAM))
        return cls(
            connection=connection_options(values),
            pull=PullSettings.from_options(values),
            **config_values(cls, values),
        )
