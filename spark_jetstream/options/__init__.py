"""Every option, defined once: its name, type, default, documentation, the config attribute it fills and
the modes (streaming read, batch read, write) it belongs to.

Spark hands options over as strings in a case-insensitive map. ``parse_options`` turns them into
typed values for one mode, refusing unknown names (suggesting the closest valid one), options of
another mode (saying where they belong), malformed values (naming the option and the expected form)
and inconsistent combinations. The config dataclasses (``SourceConfig``, ``BatchConfig``,
``SinkConfig``, ``PullSettings``, ``ConnectionOptions``) take their defaults and values from these
definitions (``default_of``, ``config_values``, ``connection_options``; ``ConnectionOptions`` keeps its
defaults itself and the definitions show them), the command line builds its connection flags from them,
and the option reference (docs/reference/options.md) is generated from them, so code and docs cannot drift apart.

This module is what the rest of the package imports; what an option is lives in ``options/option.py``, the
table in ``options/definitions.py`` (gathered from ``connection.py``, ``reads.py``, ``groups.py`` and
``writes.py``), the rules in ``options/parse.py``, the option reference in ``options/docs.py`` and the value parsers
in ``options/parsers.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from spark_jetstream.client.connection_options import ConnectionOptions
from spark_jetstream.options.definitions import OPTIONS, options_for
from spark_jetstream.options.docs import options_markdown
from spark_jetstream.options.option import ALL, BATCH, LOAD, READ, STREAM, WRITE, Option
from spark_jetstream.options.parse import SPARK_WRITE_OPTIONS, parse_options
from spark_jetstream.options.parsers import (
    ACK_POLICIES,
    DEFAULT_PRIORITY_TIMEOUT,
    READ_MODES,
    SUBJECT_PATTERN,
    parse_duration,
)

__all__ = [
    "ACK_POLICIES",
    "ALL",
    "BATCH",
    "BATCH_READER_OPTIONS",
    "CONNECTION_OPTIONS",
    "DEFAULT_PRIORITY_TIMEOUT",
    "LOAD",
    "OPTIONS",
    "PULL_OPTIONS",
    "READ",
    "READER_OPTIONS",
    "READ_MODES",
    "SPARK_WRITE_OPTIONS",
    "STREAM",
    "SUBJECT_PATTERN",
    "WRITE",
    "WRITER_OPTIONS",
    "Option",
    "config_values",
    "connection_options",
    "default_of",
    "options_for",
    "options_markdown",
    "parse_connection_options",
    "parse_duration",
    "parse_options",
]

_BY_NAME = {option.name: option for option in OPTIONS}

CONNECTION_OPTIONS = tuple(option for option in OPTIONS if option.part == "connection")
PULL_OPTIONS = tuple(option for option in OPTIONS if option.part == "pull")
READER_OPTIONS = options_for(STREAM)
BATCH_READER_OPTIONS = options_for(BATCH)
WRITER_OPTIONS = options_for(WRITE)


def default_of(name: str) -> Any:
    """The default of option ``name``: config dataclasses take their field defaults from here."""
    return _BY_NAME[name].default


def config_values(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of config dataclass ``cls`` among parsed option ``values`` (by ``Option.attr``)."""
    by_attr = {_BY_NAME[name].attr: value for name, value in values.items() if name in _BY_NAME}
    return {f.name: by_attr[f.name] for f in fields(cls) if f.name in by_attr}


def connection_options(values: Mapping[str, Any]) -> ConnectionOptions:
    """The ``ConnectionOptions`` among parsed option ``values``: built here, because the client layer that
    uses them never reads the option table."""
    return ConnectionOptions(**config_values(ConnectionOptions, values))


def parse_connection_options(raw: Mapping[str, str]) -> ConnectionOptions:
    """``ConnectionOptions`` from user option strings that are only connection options (CLI, demo, notebooks)."""
    return connection_options(parse_options(raw, CONNECTION_OPTIONS))
