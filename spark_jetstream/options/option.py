"""What an option is (``Option``: name, parser, default, documentation, modes, bounds) and the modes it can
belong to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_jetstream.errors import OptionError

STREAM, BATCH, WRITE = "readStream", "read", "write"
"""The modes: ``spark.readStream``, ``spark.read``, ``df.write``/``df.writeStream``."""
READ = frozenset({STREAM, BATCH})
ALL = frozenset({STREAM, BATCH, WRITE})
LOAD = READ
"""What ``load()`` checks: Spark does not say yet whether a streaming or a batch read is coming."""


@dataclass(frozen=True)
class Option:
    """One user-facing option.

    ``attr`` is the field it fills in a config dataclass (default: the name in snake_case); ``part``
    groups it in the docs (``connection``, ``pull``, ``read``, ``sink``); ``required`` lists the
    modes that need it; ``batch_doc`` replaces ``doc`` where batch reads mean something else by it, ``write_doc``
    where writes do; ``group_only`` options configure a group's member consumers and are refused without
    ``group``.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    modes: frozenset[str]
    part: str
    attr: str = ""
    secret: bool = False
    minimum: float | None = None
    maximum: float | None = None
    required: frozenset[str] = frozenset()
    batch_doc: str | None = None
    write_doc: str | None = None
    group_only: bool = False  # about a group's member consumers: refused without the group option

    def __post_init__(self) -> None:
        if not self.attr:
            snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in self.name.replace(".", "_"))
            object.__setattr__(self, "attr", snake)

    def convert(self, raw: str) -> Any:
        shown = "<hidden>" if self.secret else repr(raw)
        try:
            value = self.parse(raw)
        except ValueError as exc:
            raise OptionError(f"Option {self.name!r} has an invalid value {shown}: {exc}.") from None
        if self.minimum is not None and value < self.minimum:
            raise OptionError(
                f"Option {self.name!r} has an invalid value {shown}: it must be at least {self.minimum:g}."
            )
        if self.maximum is not None and value > self.maximum:
            raise OptionError(
                f"Option {self.name!r} has an invalid value {shown}: it must be at most {self.maximum:,g}."
            )
        return value

    def doc_for(self, mode: str) -> str:
        if mode == BATCH and self.batch_doc:
            return self.batch_doc
        return self.write_doc if mode == WRITE and self.write_doc else self.doc
