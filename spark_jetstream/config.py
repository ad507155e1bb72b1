"""The reader's configuration: user option strings parsed once into one typed, validated object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from .connection import ConnectionOptions
from .options import READER_OPTIONS, parse_options
from .pull import PullSettings


@dataclass(frozen=True)
class SourceConfig:
    """Everything ``spark.readStream.format("jetstream")`` was told. Picklable; secrets stay out of repr."""

    connection: ConnectionOptions
    pull: PullSettings
    stream: str
    group: str
    members: int | None = None
    starting_position: str | int | None = None
    starting_timestamp: datetime | None = None
    max_messages: int | None = None
    max_bytes: int | None = None
    min_messages: int | None = None
    max_trigger_delay: float = 900.0
    fail_on_data_loss: bool = True
    include_headers: bool = False
    ack_wait: float = 3600.0
    ack_policy: str = "explicit"

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SourceConfig:
        values = parse_options(raw, READER_OPTIONS)
        return cls(
            connection=ConnectionOptions.from_options(values),
            pull=PullSettings.from_options(values),
            stream=values["stream"],
            group=values["group"],
            members=values["members"],
            starting_position=values["startingPosition"],
            starting_timestamp=values["startingTimestamp"],
            max_messages=values["maxMessagesPerTrigger"],
            max_bytes=values["maxBytesPerTrigger"],
            min_messages=values["minMessagesPerTrigger"],
            max_trigger_delay=values["maxTriggerDelay"],
            fail_on_data_loss=values["failOnDataLoss"],
            include_headers=values["includeHeaders"],
            ack_wait=values["ackWait"],
            ack_policy=values["ackPolicy"],
        )
