"""A streaming pipeline configured from a TOML file, for ``spark-submit``.

    spark-submit --master 'local[2]' "$(python -m spark_jetstream.tools.pipeline --path)" conf/pipeline.toml

The file names the source options (``[source]``, the options of ``format("jetstream")``), an
optional SQL transform over the view ``events`` (``[transform] sql``), the sink (``[sink]``:
``format`` plus its options, ``checkpointLocation`` included), the trigger (``[trigger]``:
``processingTime``, ``availableNow`` or ``once``) and Spark settings (``[spark]``).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from spark_jetstream.errors import OptionError  # absolute: spark-submit runs this file as a script

_TRIGGERS = ("processingTime", "availableNow", "once")


def load_config(path: str) -> dict[str, Any]:
    """Read and check a pipeline file; every problem names the file and the section."""
    try:
        config = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise OptionError(f"Pipeline file {path!r} does not exist.") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionError(f"Pipeline file {path!r} is not valid TOML: {exc}.") from None
    unknown = set(config) - {"source", "transform", "sink", "trigger", "spark", "app"}
    if unknown:
        raise OptionError(f"Pipeline file {path!r} has unknown sections {sorted(unknown)}.")
    for section in ("source", "sink"):
        if not isinstance(config.get(section), dict):
            raise OptionError(f"Pipeline file {path!r} needs a [{section}] section.")
    if "format" not in config["sink"] or "checkpointLocation" not in config["sink"]:
        raise OptionError(f"The [sink] section of {path!r} needs format and checkpointLocation.")
    trigger = config.get("trigger", {"processingTime": "0 seconds"})
    if len(trigger) != 1 or next(iter(trigger)) not in _TRIGGERS:
        raise OptionError(f"The [trigger] section of {path!r} needs exactly one of {', '.join(_TRIGGERS)}.")
    config["trigger"] = trigger
    return config


def run(config: dict[str, Any]) -> None:
    """Start the query and block until it ends (``availableNow``/``once``) or is stopped."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(config.get("app", {}).get("name", "spark-jetstream-pipeline"))
    for key, value in config.get("spark", {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    events = spark.readStream.format("jetstream").options(**{k: str(v) for k, v in config["source"].items()}).load()
    sql = config.get("transform", {}).get("sql")
    if sql:
        events.createOrReplaceTempView("events")
        events = spark.sql(sql)
    sink = dict(config["sink"])
    writer = events.writeStream.format(sink.pop("format")).options(**{k: str(v) for k, v in sink.items()})
    writer = writer.trigger(**config["trigger"])
    query = writer.start()
    print(f"pipeline {query.name or query.id} running: {config['source'].get('stream')} -> {config['sink']['format']}")
    query.awaitTermination()
    for progress in query.recentProgress:
        print(f"  batch {progress['batchId']}: {progress['numInputRows']} rows")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_jetstream.tools.pipeline", description=__doc__)
    parser.add_argument("config", nargs="?", help="the pipeline's TOML file")
    parser.add_argument("--path", action="store_true", help="print this script's path (for spark-submit)")
    args = parser.parse_args(argv)
    if args.path:
        print(Path(__file__).resolve())
        return 0
    if not args.config:
        parser.error("name the pipeline's TOML file")
    try:
        run(load_config(args.config))
    except OptionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
