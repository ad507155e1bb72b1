"""spark-jetstream: NATS JetStream as an exactly-once Spark Structured Streaming source and sink."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_jetstream import logs as _logs
from spark_jetstream.errors import (
    ApiError,
    ClusterUnavailableError,
    ConnectError,
    ConsumerNotFoundError,
    DataLossError,
    FencedError,
    GroupConfigError,
    JetStreamError,
    OptionError,
    ReaderError,
    ServerTooOldError,
    StreamNotFoundError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__version__ = "0.1.0"

_logs.install()


def register(spark: SparkSession) -> None:
    """Register ``format("jetstream")`` explicitly (``pip install`` already does it on Spark start)."""
    from spark_jetstream.source import JetStreamDataSource

    spark.dataSource.register(JetStreamDataSource)


__all__ = [
    "ApiError",
    "ClusterUnavailableError",
    "ConnectError",
    "ConsumerNotFoundError",
    "DataLossError",
    "FencedError",
    "GroupConfigError",
    "JetStreamError",
    "OptionError",
    "ReaderError",
    "ServerTooOldError",
    "StreamNotFoundError",
    "__version__",
    "register",
]
