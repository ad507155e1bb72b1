"""Security against real server configurations: TLS, mutual TLS, and secrets that never leak."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jetstream.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.embedded import EmbeddedServer
from spark_jetstream.errors import ConnectError
from spark_jetstream.jsapi import JetStreamApi


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1/localhost, and a client certificate, made with openssl."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-extfile", str(d / "san.ext"), "-out", str(d / f"{name}.pem"))  # fmt: skip
    return {name: str(d / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def _tls_server(pki: dict[str, str], verify: bool) -> EmbeddedServer:
    tls = {"cert_file": pki["server.pem"], "key_file": pki["server.key"], "ca_file": pki["ca.pem"], "verify": verify}
    return EmbeddedServer({"tls": tls}, name="mtls" if verify else "tls")


@pytest.fixture(scope="module")
def tls_server(pki) -> Iterator[EmbeddedServer]:
    with _tls_server(pki, verify=False) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(pki) -> Iterator[EmbeddedServer]:
    with _tls_server(pki, verify=True) as server:
        yield server


def test_tls_with_the_servers_ca(tls_server, pki):
    options = ConnectionOptions(servers=(tls_server.url,), tls_ca=pki["ca.pem"])
    assert JetStreamApi(connect(options)).account_info()["type"].endswith("account_info_response")
    disconnect(options)


def test_tls_without_trusting_the_ca_fails_fast_and_says_so(tls_server):
    started = time.monotonic()
    with pytest.raises(ConnectError, match="TLS handshake with .* failed: check tls.ca"):
        connect(ConnectionOptions(servers=(f"tls://127.0.0.1:{tls_server.port}",), connect_timeout=3))
    assert time.monotonic() - started < 6


def test_mutual_tls(mtls_server, pki):
    options = ConnectionOptions(
        servers=(mtls_server.url,), tls_ca=pki["ca.pem"], tls_cert=pki["client.pem"], tls_key=pki["client.key"]
    )
    assert JetStreamApi(connect(options)).account_info()["type"].endswith("account_info_response")
    disconnect(options)
    with pytest.raises(ConnectError, match="TLS|certificate|refused"):
        connect(ConnectionOptions(servers=(mtls_server.url,), tls_ca=pki["ca.pem"], connect_timeout=3))


def test_half_a_client_certificate_is_refused_before_connecting(pki):
    with pytest.raises(ConnectError, match="Set both tls.cert and tls.key"):
        connect(ConnectionOptions(servers=("nats://127.0.0.1:1",), tls_ca=pki["ca.pem"], tls_cert=pki["client.pem"]))


def test_unreadable_tls_files_are_named(tmp_path):
    with pytest.raises(ConnectError, match="Cannot load the TLS files named by tls.ca/tls.cert/tls.key"):
        connect(ConnectionOptions(servers=("nats://127.0.0.1:1",), tls_ca=str(tmp_path / "missing.pem")))


def test_secrets_never_reach_logs_errors_plans_progress_or_the_checkpoint(api, tmp_path):
    import sys

    from spark_jetstream.groups import partitioned_stream_config
    from spark_jetstream.publish import publish_all

    password, wrong_token = "pw-Sekr1t-7731", "tok-Wr0ng-5582"
    with EmbeddedServer({"authorization": {"users": [{"user": "alice", "password": password}]}}, name="sec") as server:
        options = ConnectionOptions(servers=(server.url,), user="alice", password=password)
        secured = JetStreamApi(connect(options))
        secured.create_stream(partitioned_stream_config("Sec", "sec.*", 2))
        publish_all(secured.conn, ((f"sec.k{i}", b"x", None) for i in range(200)))
        checkpoint = tmp_path / "cp"
        job = Path(__file__).parent / "jobs" / "secret_job.py"
        done = subprocess.run(
            [sys.executable, str(job), server.url, password, wrong_token, str(checkpoint)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        disconnect(options)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "PLAN" in output and "EXPLAIN" in output and "numInputRows" in output
    assert "refused the credentials" in output  # the failing query's error was printed
    for secret in (password, wrong_token):
        assert secret not in output
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path


def test_nkey_authentication(tmp_path):
    import os

    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed)
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    with EmbeddedServer({"authorization": {"users": [{"nkey": public}]}}, name="nkey") as server:
        options = ConnectionOptions(servers=(server.url,), nkey=str(seed_file))
        assert JetStreamApi(connect(options)).account_info()["type"].endswith("account_info_response")
        disconnect(options)
        started = time.monotonic()
        with pytest.raises(ConnectError, match="refused the credentials \\(nkey\\)") as caught:
            connect(ConnectionOptions(servers=(server.url,), nkey=str(stranger), connect_timeout=3))
        assert time.monotonic() - started < 5
        assert seed.decode() not in str(caught.value)
