"""The spark-submit pipeline, run as users run it: spark-submit from the PySpark install."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from spark_jetstream.errors import OptionError
from spark_jetstream.tools.pipeline import load_config


def test_pipeline_file_problems_are_named(tmp_path):
    path = tmp_path / "p.toml"
    with pytest.raises(OptionError, match="does not exist"):
        load_config(str(path))
    path.write_text("[source]\nstream = 'S'\n[sink]\nformat = 'noop'\n")
    with pytest.raises(OptionError, match="needs format and checkpointLocation"):
        load_config(str(path))
    path.write_text("[source]\n[sink]\nformat='noop'\ncheckpointLocation='/x'\n[trigger]\nsoon = true\n")
    with pytest.raises(OptionError, match="exactly one of processingTime, availableNow, once"):
        load_config(str(path))
    path.write_text("[sorce]\n")
    with pytest.raises(OptionError, match=r"unknown sections \['sorce'\]"):
        load_config(str(path))


@pytest.mark.slow
def test_spark_submit_runs_the_example_pipeline_shape(nats_server, api, make_stream, spark, tmp_path):
    stream = make_stream(2500, partitions=3)
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f"""
[app]
name = "test-pipeline"
[source]
servers = "{nats_server.url}"
stream = "{stream.name}"
group = "{stream.group}"
maxMessagesPerTrigger = 1000
[transform]
sql = "SELECT subject, CAST(data AS STRING) AS body, seq, partition FROM events"
[sink]
format = "parquet"
path = "{tmp_path / "out"}"
checkpointLocation = "{tmp_path / "cp"}"
[trigger]
availableNow = true
[spark]
"spark.sql.shuffle.partitions" = 2
"spark.ui.enabled" = false
"""
    )
    script = subprocess.run(
        [sys.executable, "-m", "spark_jetstream.tools.pipeline", "--path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    done = subprocess.run(
        [shutil.which("spark-submit") or "spark-submit", "--master", "local[2]", script, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batch 2: 500 rows" in done.stdout
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.seq for r in rows) == sorted(stream.messages)
    # the payloads are "msg-<index>-<random bytes>": the transform cast them to strings
    assert {r.seq: r.body.split("-")[1] for r in rows} == {
        seq: m[1].split(b"-")[1].decode() for seq, m in stream.messages.items()
    }
    floors = {api.consumer_info(stream.name, stream.consumer(p))["ack_floor"]["stream_seq"] for p in range(3)}
    assert floors == {stream.last_seq}
