"""spark-jetstream: NATS JetStream as an exactly-once Spark Structured Streaming source and sink."""

from .errors import (
    ApiError,
    ConnectError,
    ConsumerNotFoundError,
    FencedError,
    JetStreamError,
    OptionError,
    ReaderError,
    ServerTooOldError,
    StreamNotFoundError,
)

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "ConnectError",
    "ConsumerNotFoundError",
    "FencedError",
    "JetStreamError",
    "OptionError",
    "ReaderError",
    "ServerTooOldError",
    "StreamNotFoundError",
    "__version__",
]
