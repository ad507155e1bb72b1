"""The source's row schema as Spark types, without pyarrow: ``schema()`` runs at ``load()`` in a Spark
Python process that has not imported pyarrow (~0.1 s), and need not. ``rows.arrow_schema`` is built
from this table."""

from __future__ import annotations

COLUMNS = (
    ("subject", "string"),
    ("data", "binary"),
    ("stream", "string"),
    ("seq", "bigint"),
    ("timestamp", "timestamp"),
    ("partition", "int"),
)
HEADERS_COLUMN = ("headers", "map<string,array<string>>")
"""The last column, present only with ``includeHeaders``."""


def columns(include_headers: bool) -> tuple[tuple[str, str], ...]:
    """``(name, Spark type)`` of every column."""
    return (*COLUMNS, HEADERS_COLUMN) if include_headers else COLUMNS


def spark_schema_ddl(include_headers: bool) -> str:
    """The schema as a Spark DDL string."""
    return ", ".join(f"{name} {kind}" for name, kind in columns(include_headers))
