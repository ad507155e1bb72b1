"""The ``spark-jetstream`` command, run as users run it."""

from __future__ import annotations

import re
import subprocess

import pytest

pytestmark = pytest.mark.slow


def run_demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["spark-jetstream", "demo", *args], capture_output=True, text=True, timeout=300)


def test_demo_runs_end_to_end_with_its_own_server(tmp_path):
    """The README's first command, small: Spark reads while orders are published, then checks itself."""
    done = run_demo(
        "--messages", "6000", "--rate", "3000", "--max-per-batch", "1500", "--partitions", "3", "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "OK: published 6,000 orders; Spark read 6,000 rows in " in out
    assert "revenue by region matches exactly; ack floors equal the checkpoint (seq 6,000)." in out
    for member in ("demo-0", "demo-1", "demo-2"):
        assert re.search(rf"{member}\s+6,000\s+ok", out), out
    assert re.search(r"batch\s+\d+\s+published\s+6,000\s+read\s+6,000 .* lag\s+0", out), out
    # Before the first batch the status line says what happens, never a frozen "read 0".
    status = [line for line in out.splitlines() if re.match(r"\s+\d+\.\ds  ", line)]
    assert "starting the query" in status[0], status
    assert not [line for line in status if re.search(r"read\s+0 ", line)], status
    # The summary comes from the query's progress.
    assert re.search(r"first batch: [\d,]+ rows, finished \d+\.\ds after the query started", out), out
    assert re.search(r"Spark processed [\d,]+ rows/s \(read, from_json, aggregate, parquet write\)", out), out
    assert len(list((tmp_path / "revenue_by_region").glob("batch_id=*"))) >= 4  # at most 1,500 rows per batch
    png = (tmp_path / "throughput_and_lag.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "Traceback" not in done.stderr
    assert not re.search(r"\d\d:\d\d:\d\d (WARN|ERROR)", done.stderr), done.stderr  # a quiet run


def test_demo_against_an_existing_server_then_status_of_the_derived_group(nats_server, api, tmp_path):
    done = run_demo(
        "--servers",
        nats_server.url,
        "--stream",
        "demo_kept",
        "--keep",
        "--messages",
        "2000",
        "--rate",
        "0",
        "--partitions",
        "2",
        "--out",
        str(tmp_path),
    )
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "nats-server at" not in done.stdout  # no embedded server was started
        assert sorted(api.consumer_names("demo_kept")) == ["demo-0", "demo-1"]  # the read-only pass's are gone
        shown = subprocess.run(
            ["spark-jetstream", "status", "--servers", nats_server.url, "--stream", "demo_kept", "--group", "demo"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        rows = [line.split() for line in shown.stdout.splitlines()[1:]]
        assert [(r[0], r[1], r[2]) for r in rows] == [("0", "demo-0", "0"), ("1", "demo-1", "1")]
        assert {int(r[-3]) for r in rows} == {2000}  # ack floors at the last seq, nothing pending, no lag
        assert {(int(r[-2]), int(r[-1])) for r in rows} == {(0, 0)}
    finally:
        api.delete_stream("demo_kept")


def test_demo_against_an_existing_server_refuses_to_touch_an_existing_stream(nats_server, api):
    api.create_stream({"name": "taken", "subjects": ["taken.>"]})
    try:
        done = subprocess.run(
            ["spark-jetstream", "demo", "--servers", nats_server.url, "--stream", "taken"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        api.delete_stream("taken")
    assert done.returncode == 2
    assert "Stream 'taken' already exists" in done.stderr
