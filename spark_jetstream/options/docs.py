"""The README's option tables, generated from the option definitions so code and docs cannot drift apart
(``tests/test_docs.py`` compares them)."""

from __future__ import annotations

from collections.abc import Iterable

from spark_jetstream.options.definitions import options_for
from spark_jetstream.options.option import BATCH, STREAM, WRITE, Option
from spark_jetstream.options.parsers import parse_duration, parse_size


def _default_text(option: Option, mode: str) -> str:
    default = option.default
    if default is None:
        return "required" if mode in option.required else "-"
    if isinstance(default, tuple):
        return ",".join(default)
    if option.parse is parse_duration:
        return f"{default:g}s"
    if isinstance(default, bool):
        return str(default).lower()
    if option.parse is parse_size:
        return _size_text(default)
    return str(default)


def _size_text(size: int) -> str:
    """A size as ``parse_size`` reads it, in the largest unit that divides it (``16m``)."""
    for unit, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def _table(options: Iterable[Option], mode: str) -> list[str]:
    lines = ["| option | default | meaning |", "|---|---|---|"]
    for option in options:
        lines.append(f"| `{option.name}` | {_default_text(option, mode)} | {option.doc_for(mode)} |")
    return lines


def options_markdown() -> str:
    """The README's option tables (the part between the markers in README.md)."""
    batch = [option for option in options_for(BATCH) if option.part != "connection"]
    sink = [option for option in options_for(WRITE) if option.part != "connection"]
    return "\n".join(
        [
            'Streaming reads, `spark.readStream.format("jetstream")`:',
            "",
            *_table(options_for(STREAM), STREAM),
            "",
            'Batch reads, `spark.read.format("jetstream")`: the connection options (`servers` to `silenceTimeout`) and',
            "",
            *_table(batch, BATCH),
            "",
            'Writes, `df.write.format("jetstream")` and `df.writeStream.format("jetstream")`: the connection '
            "options and",
            "",
            *_table(sink, WRITE),
        ]
    )
