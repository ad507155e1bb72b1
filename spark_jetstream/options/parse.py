"""Parsing the options given for one mode (``parse_options``) by the rules they must follow: known names (for
Spark's Kafka option names, what each is here; else the closest valid one suggested), the right mode (saying where
an option belongs), required options, well-formed values and consistent combinations."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from spark_jetstream.errors import OptionError
from spark_jetstream.options.definitions import OPTIONS, options_for
from spark_jetstream.options.kafka import kafka_sentence
from spark_jetstream.options.option import BATCH, READ, STREAM, WRITE, Option

SPARK_WRITE_OPTIONS = frozenset({"checkpointlocation", "queryname"})
"""Options Spark itself adds to a streaming writer's options (PySpark 4.0-4.3, and a declarative pipeline's sink):
not ours to check, nor to use."""

_PATH = {
    WRITE: "name the stream's subject with .option('subject', ...), and call save() without a path",
    STREAM: "name the stream with .option('stream', ...) (or a KV bucket with .option('bucket', ...)), and call "
    "load() without a path",
}
"""What a path given to ``load(path)`` or ``save(path)`` (Spark's option 'path') is told to do instead."""

_WRONG_MODE = {
    BATCH: "applies to spark.readStream only: a batch read has no micro-batches or member consumers. Remove it "
    "from spark.read.",
    STREAM: "applies to spark.read only: a streaming query has no end. Use trigger(availableNow=True) to stop at "
    "the messages there are when it starts.",
}
"""What an option of the other read mode is told, by the mode it was given to."""


def parse_options(raw: Mapping[str, str], allowed: str | frozenset[str] | Iterable[Option]) -> dict[str, Any]:
    """Check names against ``allowed`` (a mode, a set of modes, or the options themselves; case-insensitively,
    as Spark does) and convert values; then the rules between options."""
    if isinstance(allowed, str):
        allowed = frozenset({allowed})
    modes: frozenset[str] = allowed if isinstance(allowed, frozenset) else frozenset()
    options = options_for(modes) if modes else tuple(allowed)  # type: ignore[arg-type]
    by_lower = {option.name.lower(): option for option in options}
    if WRITE in modes:
        raw = {key: value for key, value in raw.items() if key.lower() not in SPARK_WRITE_OPTIONS}
    path = next((value for key, value in raw.items() if key.lower() == "path"), None)
    if path is not None:
        raise OptionError(
            f"The jetstream format takes no path ({path!r}, given to load() or save()): "
            f"{_PATH[WRITE if WRITE in modes else STREAM]}."
        )
    if len(modes) == 1 and (mode := next(iter(modes))) in _WRONG_MODE:
        for key in raw:
            other = next((o for o in OPTIONS if o.name.lower() == key.lower() and o.modes & READ), None)
            if other is not None and key.lower() not in by_lower:
                raise OptionError(f"Option {other.name!r} {_WRONG_MODE[mode]}")
    values = {option.name: option.default for option in by_lower.values()}
    given = {key.lower() for key in raw}
    missing = [
        option.name for option in by_lower.values() if option.name.lower() not in given and _required(option, modes)
    ]
    if missing:
        raise OptionError(f"Option {missing[0]!r} is required: set it with .option({missing[0]!r}, ...).")
    for key, raw_value in raw.items():
        option = by_lower.get(key.lower())
        if option is None:
            if (kafka := kafka_sentence(key)) is not None:
                raise OptionError(f"Unknown option {key!r}. {kafka.replace('`', chr(39))}")
            names = [option.name for option in by_lower.values()]
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.5) or difflib.get_close_matches(
                key.lower(), list(by_lower), n=1, cutoff=0.5
            )
            hint = f" Did you mean {by_lower[close[0].lower()].name!r}?" if close else ""
            raise OptionError(f"Unknown option {key!r}.{hint} Valid options: {', '.join(sorted(names))}.")
        values[option.name] = option.convert(str(raw_value))
    _check_combinations(values, given, modes)
    return values


def _required(option: Option, modes: frozenset[str]) -> bool:
    """Required in every mode asked for (``load()`` asks for both reads: ``group`` is optional in one)."""
    if not modes:
        return bool(option.required)
    return bool(option.required) and modes <= option.required


_EXCLUSIVE = (
    ("startingPosition", "startingTimestamp"),
    ("endingPosition", "endingTimestamp"),
    ("creds", "credsSecret"),
    ("nkey", "nkeySecret"),
    ("tls.key", "tls.keySecret"),
    ("domain", "apiPrefix"),
)
"""Pairs of options that say the same thing two ways (a domain is an API prefix too, ``$JS.<domain>.API``): take
one of each."""


def _check_combinations(values: dict[str, Any], given: set[str], modes: frozenset[str]) -> None:
    """The rules between options. A pull's expiry must stay under half the pin's timeout (or the pin lapses between
    pulls), and its heartbeat must fit twice into it (the server refuses it otherwise): an explicit value that does
    not is refused, a default drops (to a quarter of ``priorityTimeout``, to half of ``pullExpires``)."""
    for first, second in _EXCLUSIVE:
        if first.lower() in given and second.lower() in given:
            raise OptionError(f"Set {first} or {second}, not both.")
    _check_bucket(values, given, modes)
    if "group" in values and not values["group"]:
        if values.get("startingPosition") == "group":
            raise OptionError("startingPosition=group needs the group option: whose ack floor would it start at?")
        for option in OPTIONS:
            if option.group_only and option.name.lower() in given:
                raise OptionError(
                    f"Option {option.name!r} applies to the member consumers of a group, and this read has none: set "
                    f"the group option, or remove {option.name}."
                )
    elif values.get("group") and values.get("subjects") is not None:
        raise OptionError(
            f"Option 'subjects' applies to reads without a group: group {values['group']!r} reads what its member "
            "consumers' filters select. Remove subjects, or the group option."
        )
    start, end = values.get("startingPosition"), values.get("endingPosition")
    if isinstance(start, int) and isinstance(end, int) and end < start:
        raise OptionError(
            f"endingPosition ({end}) is before startingPosition ({start}): a batch read covers the stream "
            "sequences from startingPosition up to and including endingPosition."
        )
    start, end = values.get("startingTimestamp"), values.get("endingTimestamp")
    if start is not None and end is not None and end <= start:
        raise OptionError(
            f"endingTimestamp ({end.isoformat()}) is not after startingTimestamp ({start.isoformat()}): a batch "
            "read covers the messages stored at or after startingTimestamp and before endingTimestamp."
        )
    expires, timeout = values.get("pullExpires"), values.get("priorityTimeout")
    if expires is not None and timeout is not None and expires * 2 >= timeout and "pullexpires" not in given:
        values["pullExpires"] = expires = timeout / 4  # the default, under a short priorityTimeout
    elif expires is not None and timeout is not None and expires * 2 >= timeout:
        raise OptionError(
            f"Option 'pullExpires' has an invalid value: {expires:g}s is not under half of priorityTimeout "
            f"({timeout:g}s), the member consumers' priority_timeout, so the pin would lapse between pulls: use at "
            f"most {timeout / 2 - 1:g}s, or raise priorityTimeout."
        )
    heartbeat = values.get("pullIdleHeartbeat")
    if expires is not None and heartbeat is not None and heartbeat > expires / 2:
        if "pullidleheartbeat" in given:
            raise OptionError(
                f"Option 'pullIdleHeartbeat' has an invalid value: {heartbeat:g}s is more than half of pullExpires "
                f"({expires:g}s), and the server refuses such pulls. Use at most {expires / 2:g}s, or leave it unset."
            )
        values["pullIdleHeartbeat"] = expires / 2


_NOT_WITH_BUCKET = ("group", "subjects", "includeHeaders", "progressSubject", "subject", "expectedStream")
"""Options of a stream's reads and writes that a bucket's do not take (its rows have columns of their own)."""


def _check_bucket(values: dict[str, Any], given: set[str], modes: frozenset[str]) -> None:
    """A read names a stream or a KV bucket; options only a bucket's reads take need ``bucket``, and a bucket's
    reads and writes refuse those of a stream's."""
    if "stream" in values and not values["stream"] and not values.get("bucket"):
        raise OptionError(
            "Option 'stream' is required: set it with .option('stream', ...), or .option('bucket', ...) to read a KV "
            "bucket."
        )
    snapshot = values.get("startingPosition") == "snapshot"
    if not values.get("bucket"):
        for name in ("keys", "includeHistory"):
            if name.lower() in given:
                raise OptionError(f"Option {name!r} applies to KV buckets: set the bucket option, or remove {name}.")
        if snapshot:
            raise OptionError("startingPosition=snapshot applies to a KV bucket's changes: set the bucket option.")
        return
    if snapshot and modes == {BATCH}:
        raise OptionError(
            "startingPosition=snapshot applies to spark.readStream of a bucket (its latest values, then its changes): "
            "a batch read of a bucket gives its latest values by itself."
        )
    if values.get("stream"):
        raise OptionError(
            "Option 'bucket' and option 'stream' are both set: set one (a bucket is the stream KV_<bucket>, read by "
            "key)."
        )
    for name in _NOT_WITH_BUCKET:
        if name.lower() in given:
            fix = "use keys to filter keys" if name == "subjects" else f"remove {name}"
            raise OptionError(
                f"Option {name!r} does not apply to a KV bucket's rows (bucket {values['bucket']!r}): {fix}."
            )
