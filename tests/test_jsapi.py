"""A stream create that races nats-server's clean-up of an account's last deleted stream is asked again; a store
error that lasts is raised as the server gave it, soon."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import STORE_RACE_GRACE, JetStreamApi
from spark_jetstream.errors import ApiError
from spark_jetstream.testing import EmbeddedServer

pytestmark = pytest.mark.slow

CONFIG = {"name": "RACED", "subjects": ["raced.>"]}


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    """A server of its own, without streams: its account's ``streams`` directory does not exist yet."""
    with EmbeddedServer(name="jsapi") as server:
        yield server
        disconnect(ConnectionOptions(servers=(server.url,)))


def _streams(server: EmbeddedServer) -> Path:
    streams = Path(server.dir, "js", "jetstream", "$G", "streams")
    streams.parent.mkdir(parents=True)
    return streams


def _failed_creates(server: EmbeddedServer) -> int:
    return Path(server.dir, "server.log").read_text().count("Stream create failed for '$G > RACED'")


def test_a_create_that_fails_to_make_its_store_for_a_moment_is_asked_again(server):
    """A file where the ``streams`` directory goes: the create fails (10049), and the server's clean-up after the
    failure removes the file, as its clean-up after a delete removes the directory in the race."""
    api = JetStreamApi(connect(ConnectionOptions(servers=(server.url,))))
    streams = _streams(server)
    streams.write_text("in the way")
    info = api.create_stream(CONFIG)
    assert info["config"]["subjects"] == ["raced.>"]
    assert (streams / "RACED").is_dir(), "the store is not where the test made the race"
    assert _failed_creates(server) >= 1, "the first create did not fail: the test did not make the race"


def test_a_store_error_that_lasts_is_raised_as_the_server_gave_it(server):
    """An immutable ``streams`` directory (``chattr +i``, even root cannot write into it): every create fails."""
    api = JetStreamApi(connect(ConnectionOptions(servers=(server.url,))))
    streams = _streams(server)
    streams.mkdir()
    subprocess.run(["chattr", "+i", str(streams)], check=True)
    try:
        started = time.monotonic()
        with pytest.raises(ApiError) as caught:
            api.create_stream(CONFIG)
        took = time.monotonic() - started
    finally:
        subprocess.run(["chattr", "-i", str(streams)], check=True)
    assert str(caught.value) == "Creating stream 'RACED': error creating store for stream (error 10049)"
    assert _failed_creates(server) >= 2, "asked once only"
    assert took < STORE_RACE_GRACE + 3, f"raised after {took:.1f} s, not soon after the grace"
