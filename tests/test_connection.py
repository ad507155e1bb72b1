"""Connecting: bad servers, bad credentials and old servers fail fast with a clear message."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from spark_jetstream.client.connection import (
    DIRECT_FIRST_REPLY,
    DIRECT_MAX_WAIT,
    Connection,
    ConnectionOptions,
    connect,
    disconnect,
)
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.errors import ConnectError
from spark_jetstream.testing import EmbeddedServer, free_port


@pytest.mark.slow
def test_refused_connection_fails_within_the_connect_timeout():
    url = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        connect(ConnectionOptions(servers=(url,), connect_timeout=1.5))
    assert str(caught.value) == (
        f"Cannot reach a NATS server at {url} within 1.5s: the connection was refused (nothing listens there): "
        "check the servers option and that nats-server is running."
    )
    assert time.monotonic() - started < 1.5 + 3


@pytest.mark.slow
def test_a_server_that_never_answers_times_out():
    """A real server, stopped (SIGSTOP): the kernel accepts the connection, the INFO never comes."""
    with EmbeddedServer(name="frozen") as server:
        server.freeze()
        try:
            started = time.monotonic()
            with pytest.raises(ConnectError) as caught:
                connect(ConnectionOptions(servers=(server.url,), connect_timeout=1.5))
            elapsed = time.monotonic() - started
        finally:
            server.thaw()
    assert str(caught.value) == (
        f"Cannot reach a NATS server at {server.url} within 1.5s: no answer (timed out): check the servers option "
        "and firewalls; raise connectTimeout for a slow network."
    )
    assert elapsed < 1.5 + 3


@pytest.mark.slow
def test_an_unknown_host_is_named():
    with pytest.raises(ConnectError) as caught:
        connect(ConnectionOptions(servers=("nats://no-such-host.invalid:4222",), connect_timeout=2))
    assert str(caught.value).startswith(
        "Cannot reach a NATS server at nats://no-such-host.invalid:4222: the host name does not resolve ("
    )
    assert str(caught.value).endswith("): check the servers option.")


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


SECRETS = ("wrong-Pa55", "pw-Sekr1t-42", "tok-Wr0ng-123")


@pytest.mark.parametrize(
    ("options", "url_userinfo", "says"),
    [
        ({"user": "alice", "password": "wrong-Pa55"}, "", "refused the credentials (user/password)"),
        ({"user": "mallory", "password": "pw-Sekr1t-42"}, "", "refused the credentials (user/password)"),
        ({"token": "tok-Wr0ng-123"}, "", "refused the credentials (token)"),
        ({}, "alice:wrong-Pa55@", "refused the credentials (user/password in the servers URL)"),
        ({}, "tok-Wr0ng-123@", "refused the credentials (token in the servers URL)"),
    ],
    ids=["wrong-password", "unknown-user", "token-instead", "password-in-url", "token-in-url"],
)
def test_refused_credentials_fail_fast_and_name_the_cause(secured_server, options, url_userinfo, says):
    url = secured_server.url.replace("nats://", f"nats://{url_userinfo}")
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        connect(ConnectionOptions(servers=(url,), connect_timeout=3, **options))
    assert time.monotonic() - started < 3 + 3
    shown = secured_server.url.replace("nats://", "nats://alice:***@" if ":" in url_userinfo else "nats://***@")
    assert str(caught.value) == (
        f"The NATS server at {shown if url_userinfo else secured_server.url} {says}: check the creds, nkey, token "
        "or user/password options."
    )
    for secret in SECRETS:
        assert secret not in str(caught.value) + repr(caught.value)


def test_no_credentials_for_a_server_that_needs_them(secured_server):
    with pytest.raises(ConnectError) as caught:
        connect(ConnectionOptions(servers=(secured_server.url,), connect_timeout=3))
    assert str(caught.value) == (
        f"The NATS server at {secured_server.url} requires credentials, and none were given: set the creds, nkey, "
        "token or user and password option."
    )


@pytest.mark.slow
def test_token_auth():
    with EmbeddedServer({"authorization": {"token": "tok-R1ght-9"}}, name="token") as server:
        options = ConnectionOptions(servers=(server.url,), token="tok-R1ght-9")
        try:
            assert JetStreamApi(connect(options)).account_info()["type"].endswith("account_info_response")
            with pytest.raises(ConnectError, match="refused the credentials"):
                connect(ConnectionOptions(servers=(server.url,), token="tok-Wr0ng-9", connect_timeout=2))
        finally:
            disconnect(options)  # a cached client would reconnect to a later server given the same port


@pytest.mark.parametrize(
    ("option", "content", "says"),
    [
        ("creds", None, "The creds file '{path}' does not exist or is not a file: check the creds option."),
        ("nkey", None, "The nkey file '{path}' does not exist or is not a file: check the nkey option."),
        (
            "nkey",
            "not a seed\n",
            "The nkey file '{path}' holds no valid nkey seed: check the nkey option (the file holds one seed, SU..., "
            "as `nk -gen user` writes it).",
        ),
        (
            "creds",
            "-----BEGIN NATS USER JWT-----\neyJhbGciOi.e30.c2ln\n------END NATS USER JWT------\n",
            "The creds file '{path}' does not hold a user JWT and a valid nkey seed: check the creds option (a .creds "
            "file as `nsc generate creds` writes it).",
        ),
    ],
    ids=["creds-missing", "nkey-missing", "nkey-not-a-seed", "creds-without-seed"],
)
def test_unusable_credential_files_are_named_before_connecting(secured_server, tmp_path, option, content, says):
    path = tmp_path / f"user.{option}"
    if content is not None:
        path.write_text(content)
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        connect(ConnectionOptions(servers=(secured_server.url,), **{option: str(path)}))
    assert str(caught.value) == says.format(path=path)
    assert time.monotonic() - started < 1


def test_wrong_jetstream_domain_is_explained(conn: Connection, nats_server):
    options = ConnectionOptions(servers=(nats_server.url,), domain="nowhere")
    with pytest.raises(ConnectError, match="is JetStream enabled, and is the domain option right"):
        JetStreamApi(connect(options)).account_info()


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (RuntimeError(), "Connecting to the NATS server at nats://alice:***@h:4222 failed (RuntimeError): check the "
         "servers and connection options."),
        (RuntimeError("odd"), "Connecting to the NATS server at nats://alice:***@h:4222 failed (RuntimeError: odd): "
         "check the servers and connection options."),
        (TimeoutError(), "Cannot reach a NATS server at nats://alice:***@h:4222 within 5s: no answer (timed out): "
         "check the servers option and firewalls; raise connectTimeout for a slow network."),
    ],
)  # fmt: skip
def test_errors_without_a_message_still_get_a_sentence_naming_the_option(error, says):
    """nats-py raises some errors with empty messages; no cause is ever explained by an empty sentence."""
    from spark_jetstream.client.credentials import explain_failure

    assert explain_failure([error], ConnectionOptions(servers=("nats://alice:pw-9@h:4222",))) == says


def _dialed(port: int, within: float) -> bool:
    """Whether something connects to ``port`` on loopback within ``within`` seconds (it is let go at once)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        listener.settimeout(within)
        try:
            caller, _ = listener.accept()
        except TimeoutError:
            return False
        caller.close()
        return True


@pytest.mark.slow
def test_a_connection_a_spark_worker_made_stops_dialing_a_server_gone_for_good(spark):
    """A reused Python worker keeps the connection its task made. Once the server is gone for good it dials the
    port (what listens there later gets a client that sends nothing) for twice the API deadline, then closes."""
    server = EmbeddedServer(name="gone").start()
    options = ConnectionOptions(servers=(server.url,), request_timeout=8.0)
    conn = connect(options)
    JetStreamApi(conn).create_stream({"name": "GONE", "subjects": ["gone.>"], "allow_direct": True})
    publish_all(conn, ((f"gone.{i}", b"x", None) for i in range(20)))
    read = spark.read.format("jetstream").option("servers", server.url).option("requestTimeout", "8s")
    df = read.option("stream", "GONE").load()
    assert sorted(row.seq for row in df.select("seq").collect()) == list(range(1, 21))
    disconnect(options)
    server.close()
    assert _dialed(server.port, 5), "no worker kept a connection: the test shows nothing"
    time.sleep(2 * options.request_timeout + 5)  # its attempts: 0.5 s apart, and the one let go above
    assert not _dialed(server.port, 3), "a Spark worker's connection still dials a server gone for good"


def test_a_direct_get_waits_a_fraction_of_a_second_for_its_first_reply_and_backs_off():
    """``Connection.direct_wait``: a silent replica swallows its share of Direct Gets, so a first reply is waited for
    briefly (four times the slowest recent one, at least ``DIRECT_FIRST_REPLY``), twice as long per attempt in a row
    that ran out (a busy server is asked less often, and a slow one is waited for), never past ``DIRECT_MAX_WAIT``; a
    slow reply is forgotten gradually."""
    conn = Connection(ConnectionOptions(servers=("nats://127.0.0.1:4222",)), None, None)  # type: ignore[arg-type]
    assert [conn.direct_wait(n) for n in range(7)] == [DIRECT_FIRST_REPLY, 0.5, 1, 2, 4, DIRECT_MAX_WAIT, 8]
    conn.replied(0.002)
    assert conn.direct_wait(0) == DIRECT_FIRST_REPLY
    conn.replied(0.1)
    assert conn.direct_wait(0) == pytest.approx(0.4) and conn.direct_wait(1) == pytest.approx(0.8)
    assert conn.direct_wait(2) == pytest.approx(1.6)
    conn.replied(0.01)
    assert conn.direct_wait(0) == pytest.approx(4 * 0.08)
    for _ in range(20):
        conn.replied(0.001)
    assert conn.direct_wait(0) == DIRECT_FIRST_REPLY
