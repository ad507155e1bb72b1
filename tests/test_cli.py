"""The ``spark-jetstream`` command, run as users run it."""

from __future__ import annotations

import subprocess


def test_demo_runs_end_to_end_with_its_own_server():
    done = subprocess.run(
        ["spark-jetstream", "demo", "--messages", "3000", "--partitions", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: published 3,000, read 3,000; reading acked nothing (ack floors all 0)." in done.stdout
    for member in ("demo-0", "demo-1", "demo-2"):
        assert member in done.stdout


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
