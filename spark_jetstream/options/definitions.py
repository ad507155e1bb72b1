"""The table of every option, defined once: its name, type, default, documentation, the config attribute it
fills and the modes (streaming read, batch read, write) it belongs to, gathered from one file per purpose:
``options/connection.py``, ``options/reads.py``, ``options/groups.py`` and ``options/writes.py`` (the option reference's
tables list them in that order).

The table only: ``options/option.py`` is what an option is, ``options/__init__.py`` how the rest of the package
reads them (``parse_options``, ``default_of``, ``config_values``), ``options/parse.py`` the rules a set of given
options must follow and ``options/docs.py`` the option reference built from them.
"""

from __future__ import annotations

from collections.abc import Iterable

from spark_jetstream.options.connection import CONNECTION
from spark_jetstream.options.groups import GROUPS
from spark_jetstream.options.option import Option
from spark_jetstream.options.reads import READS
from spark_jetstream.options.writes import WRITES

OPTIONS: tuple[Option, ...] = (*CONNECTION, *READS, *GROUPS, *WRITES)

_BY_ATTR = {option.attr: option for option in OPTIONS}
assert len(_BY_ATTR) == len(OPTIONS), "two options fill the same config attribute"


def options_for(modes: str | Iterable[str]) -> tuple[Option, ...]:
    """The options of ``modes`` (a mode or several), in definition order."""
    wanted = {modes} if isinstance(modes, str) else set(modes)
    return tuple(option for option in OPTIONS if option.modes & wanted)
