"""The reader's configuration: user option strings parsed once into one typed, validated object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from spark_jetstream.client.connection import ConnectionOptions
from spark_jetstream.options import STREAM, config_values, connection_options, default_of, parse_options
from spark_jetstream.stream.pull import PullSettings


@dataclass(frozen=True)
class SourceConfig:
    """Everything ``spark.readStream.format("jetstream")`` was told. Picklable; secrets stay out of repr.

    Field defaults and the option each field comes from are in ``options.OPTIONS``.
    """

    connection: ConnectionOptions
    pull: PullSettings
    stream: str
    group: str
    members: int | None = None
    starting_position: str | int | None = None
    starting_timestamp: datetime | None = None
    max_messages: int | None = None
    max_bytes_per_trigger: int | None = None
    min_messages: int | None = None
    max_trigger_delay: float = default_of("maxTriggerDelay")
    fail_on_data_loss: bool = default_of("failOnDataLoss")
    include_headers: bool = default_of("includeHeaders")
    ack_wait: float = default_of("ackWait")
    ack_policy: str = default_of("ackPolicy")
    direct_batch: int = default_of("directGetBatch")

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SourceConfig:
        values = parse_options(raw, STREAM)
        return cls(
            connection=connection_options(values),
            pull=PullSettings.from_options(values),
            **config_values(cls, values),
        )
