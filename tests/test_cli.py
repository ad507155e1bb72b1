"""The ``spark-jetstream`` command, run as users run it (a demo against an existing server that needs creds, then
``status`` of its group: ``test_security``)."""

from __future__ import annotations

import subprocess

import pytest

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
