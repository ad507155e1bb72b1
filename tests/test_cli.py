"""The ``spark-jetstream`` command, run as users run it (a demo against an existing server that needs creds, then
``status`` of its group: ``test_security``)."""

from __future__ import annotations

import json
import subprocess
import time
from unittest.mock import ANY

import pytest

from spark_jetstream.client.publish import publish_all
from spark_jetstream.sink.markers import ensure_bucket, markers, read_marker, write_marker
from spark_jetstream.tools.cli import main

pytestmark = pytest.mark.slow


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


def test_commits_lists_and_forgets_the_markers_of_retired_queries(nats_server, conn, api, capsys):
    """A streaming writer's commit bucket holds a key per query id for ever: ``commits forget`` removes those of
    queries that will not run again, by id or by age, and their subjects with them."""
    bucket = "retired-commits"
    ensure_bucket(conn, bucket, 1)
    write_marker(conn, bucket, "q-old", 41)
    write_marker(conn, bucket, "q-gone", 7)
    written = time.monotonic()

    def cli(*args: str) -> list[str]:
        done = subprocess.run(
            ["spark-jetstream", "commits", *args, "--bucket", bucket, "--servers", nats_server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return [line.split()[0] for line in done.stdout.splitlines()]

    assert cli("list") == ["query", "q-old", "q-gone"]
    assert cli("forget", "--query-id", "q-gone") == ["forgot"]
    # The age cut runs in this process right after q-live is written: a command's start-up on a loaded machine
    # must not age q-live past the cut (it did, in CI, with 2.5 s between them and a subprocess).
    time.sleep(max(0.0, 4.0 - (time.monotonic() - written)))
    write_marker(conn, bucket, "q-live", 12)
    capsys.readouterr()
    assert main(["commits", "forget", "--older-than", "2s", "--bucket", bucket, "--servers", nats_server.url]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["forgot"]
    assert [marker.query_id for marker in markers(conn, bucket)] == ["q-live"]
    assert read_marker(conn, bucket, "q-live") == 12
    assert api.stream_info(f"KV_{bucket}")["state"]["num_subjects"] == 1


def test_commits_lists_and_forgets_the_progress_markers_of_retired_writers(nats_server, conn, api, capsys):
    """A writer with progressSubject keeps a marker subject per query (or write) id and partition in the target
    stream: ``commits --progress-subject`` lists them per id and removes those of an id that will not write again."""
    api.create_stream({"name": "PROGRESSED", "subjects": ["rows.>", "prog.>"]})
    try:
        written = [("prog.sjp-q1.0", 3), ("prog.sjp-q1.1", 4), ("prog.sjp-q2.0", 9)]
        markers_ = [(s, json.dumps({"batch": b, "chunk": 0, "rows": 5, "id": "x"}).encode(), None) for s, b in written]
        publish_all(conn, [*markers_, ("rows.a", b"a row", None), ("prog.other.0", b"not a marker", None)])

        def cli(*args: str) -> list[list[str]]:
            capsys.readouterr()
            assert main(["commits", *args, "--progress-subject", "prog", "--servers", nats_server.url]) == 0
            return [line.split()[:3] for line in capsys.readouterr().out.splitlines()]

        assert cli("list") == [["query", "id", "batch"], ["q1", "4", ANY], ["q2", "9", ANY]]
        assert cli("forget", "--query-id", "q1") == [["forgot", "query", "q1"]]
        assert api.subjects("PROGRESSED", ">") == ["prog.other.0", "prog.sjp-q2.0", "rows.a"]
    finally:
        api.delete_stream("PROGRESSED")
