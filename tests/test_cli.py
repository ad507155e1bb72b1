"""The ``spark-jetstream`` command, run as users run it."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.slow


def run_demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["spark-jetstream", "demo", *args], capture_output=True, text=True, timeout=300)


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
        assert sorted(api.consumer_names("demo_kept")) == ["demo-0", "demo-1"]  # the read-only pass has no group
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
