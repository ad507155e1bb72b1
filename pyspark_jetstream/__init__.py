"""Auto-registration shim: Spark registers ``pyspark_*`` modules' ``DefaultSource`` by its name()."""

from spark_jetstream.source import JetStreamDataSource as DefaultSource

__all__ = ["DefaultSource"]
