"""What a write was told, and which of the DataFrame's columns it uses.

Both are settled on the driver when the write is planned (``SinkConfig.parse``, ``check_columns``),
so a wrong option or column fails before any task publishes a message.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from spark_jetstream.client.connection import ConnectionOptions
from spark_jetstream.errors import SchemaError
from spark_jetstream.options import WRITE, config_values, connection_options, default_of, parse_options

_COLUMNS = ("subject", "data", "headers", "msg_id")


@dataclass(frozen=True)
class SinkConfig:
    """Everything ``format("jetstream")`` was told for a write. Picklable; secrets stay out of repr."""

    connection: ConnectionOptions
    subject: str | None = None
    deduplicate: bool = default_of("deduplicate")
    expected_stream: str | None = None
    progress_subject: str | None = None
    bucket: str | None = None
    atomic_batch_size: int = default_of("atomicBatchSize")
    commit_bucket: str = default_of("commitBucket")
    commit_bucket_replicas: int | None = None
    window: int = default_of("publishWindow")
    window_bytes: int = default_of("publishWindowBytes")
    timeout: float = default_of("publishTimeout")

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SinkConfig:
        values = parse_options(raw, WRITE)
        return cls(connection=connection_options(values), **config_values(cls, values))


@dataclass(frozen=True)
class Columns:
    """Positions of the input columns the writer uses (None: absent)."""

    data: int
    subject: int | None = None
    headers: int | None = None
    msg_id: int | None = None


def check_columns(schema: StructType, config: SinkConfig) -> Columns:
    """Map the DataFrame's columns, or raise ``SchemaError`` naming the column and the accepted types.

    Runs on the driver when the write is planned, so nothing is published from a DataFrame that
    does not fit.
    """
    by_name = {f.name.lower(): (i, f) for i, f in enumerate(schema.fields)}
    for name in by_name:
        if name not in _COLUMNS:
            close = difflib.get_close_matches(name, _COLUMNS, n=1, cutoff=0.75)
            if close and close[0] not in by_name:
                raise SchemaError(
                    f"Column {name!r} is not used by the jetstream writer: did you mean {close[0]!r}? It reads "
                    "subject, data, headers and msg_id and ignores other columns."
                )

    def typed(name: str, accepted: dict[str, Callable[[DataType], bool]]) -> int | None:
        found = by_name.get(name)
        if found is None:
            return None
        index, field = found
        if not any(fits(field.dataType) for fits in accepted.values()):
            raise SchemaError(
                f"Column {name!r} has type {field.dataType.simpleString()}, but the jetstream writer accepts "
                f"{' or '.join(accepted)}: cast it."
            )
        return index

    def is_string(t: DataType) -> bool:
        return isinstance(t, StringType)

    def is_string_map(t: DataType) -> bool:
        return isinstance(t, MapType) and is_string(t.keyType) and is_string(t.valueType)

    def is_list_map(t: DataType) -> bool:
        return (
            isinstance(t, MapType)
            and is_string(t.keyType)
            and isinstance(t.valueType, ArrayType)
            and is_string(t.valueType.elementType)
        )

    data = typed("data", {"binary": lambda t: isinstance(t, BinaryType), "string": is_string})
    if data is None:
        raise SchemaError(
            "The DataFrame has no 'data' column: add the message payloads as a binary or string column named data."
        )
    subject = typed("subject", {"string": is_string})
    if subject is None and config.subject is None:
        raise SchemaError(
            "The DataFrame has no 'subject' column and the subject option is not set: add a string column named "
            "subject, or .option('subject', ...)."
        )
    headers = typed("headers", {"map<string,string>": is_string_map, "map<string,array<string>>": is_list_map})
    return Columns(data=data, subject=subject, headers=headers, msg_id=typed("msg_id", {"string": is_string}))
