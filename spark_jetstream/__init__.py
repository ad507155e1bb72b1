"""spark-jetstream: NATS JetStream as an exactly-once Spark Structured Streaming source and sink.

The public names are those in ``__all__`` (docs/reference/api.md lists them): they follow semantic versioning from
1.0. Every other module and name of the package is internal and may change in any release.
"""

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
    NotPermittedError,
    OptionError,
    ReaderError,
    SchemaError,
    ServerTooOldError,
    SparkVersionError,
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


_LAZY = {
    "JetStreamAdmin": "spark_jetstream.tools.admin",
    "MemberStatus": "spark_jetstream.groups.admin",
    "BatchProgress": "spark_jetstream.tools.monitoring",
    "JetStreamLagListener": "spark_jetstream.tools.monitoring",
    "batch_progress": "spark_jetstream.tools.monitoring",
}
"""Public names defined further down the package, loaded when first asked for: Spark's Python workers import the
package and need none of them, nothing in the package imports them from here (``tools`` is a layer above this
one), and the monitoring ones need PySpark, which the package does not require."""


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'spark_jetstream' has no attribute {name!r}")


__all__ = [
    "ApiError",
    "BatchProgress",
    "ClusterUnavailableError",
    "ConnectError",
    "ConsumerNotFoundError",
    "DataLossError",
    "FencedError",
    "GroupConfigError",
    "JetStreamAdmin",
    "JetStreamError",
    "JetStreamLagListener",
    "MemberStatus",
    "NotPermittedError",
    "OptionError",
    "ReaderError",
    "SchemaError",
    "ServerTooOldError",
    "SparkVersionError",
    "StreamNotFoundError",
    "__version__",
    "batch_progress",
    "register",
]
