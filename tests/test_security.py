"""Security against real server configurations: TLS, mutual TLS, and secrets that never leak."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import error_text

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import ConnectError, OptionError
from spark_jetstream.options import parse_connection_options
from spark_jetstream.testing import EmbeddedServer


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


@pytest.mark.slow
def test_a_bulk_read_over_tls_gathers_with_the_low_water_mark_and_reads_every_message(tls_server, pki):
    """The read loop's low-water mark is set on the socket under TLS (it counts encrypted bytes): a partition's
    Direct Get read owed thousands of messages sets it, and gets exactly the partition's messages of a read of the
    whole stream, in order."""
    from spark_jetstream.client.publish import publish_all
    from spark_jetstream.groups.layout import partitioned_stream_config
    from spark_jetstream.read.direct import read_range
    from spark_jetstream.read.ranges import SeqRange

    options = ConnectionOptions(servers=(tls_server.url,), tls_ca=pki["ca.pem"])
    conn = connect(options)
    try:
        api = JetStreamApi(conn)
        api.create_stream({**partitioned_stream_config("Gather", "gather.*", 4), "allow_direct": True})
        publish_all(conn, ((f"gather.k{i % 64}", b"%06d" % i, None) for i in range(20_000)))
        low_water = conn.client.low_water
        assert low_water is not None, "a TLS connection's read loop has no low-water mark"
        marks: list[int] = []
        wait_for = low_water.wait_for

        def marking(wanted: int) -> None:
            marks.append(wanted)
            wait_for(wanted)

        def rows(subject_filter: str) -> list[tuple[int, int, bytes]]:
            batches = read_range(conn, SeqRange("Gather", subject_filter, 0, 20_000, True))
            return [(r["partition"], r["seq"], r["data"]) for batch in batches for r in batch.to_pylist()]

        low_water.wait_for = marking  # type: ignore[method-assign]
        try:
            partition = rows("1.>")
        finally:
            del low_water.wait_for
        everything = rows(">")
        assert any(marks), "a read owed thousands of messages over TLS never set a low-water mark"
        assert len(everything) == 20_000 and partition == [row for row in everything if row[0] == 1]
        assert 3_000 < len(partition) < 7_000, "the 64 subjects did not spread over the 4 partitions"
        api.delete_stream("Gather")
    finally:
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


@pytest.mark.slow
def test_a_query_with_the_tls_key_as_text_shows_it_nowhere(mtls_server, pki, spark, tmp_path):
    """Through Spark, on a server that verifies client certificates: ``tls.keySecret`` reads exactly and its PEM is in
    no plan, ``explain`` or progress (Spark's ``spark.redaction.regex`` matches the option's name)."""
    from spark_jetstream.client.publish import publish_all

    key = Path(pki["client.key"]).read_text()
    tls = {"servers": mtls_server.url, "tls.ca": pki["ca.pem"], "tls.cert": pki["client.pem"], "tls.keySecret": key}
    options = parse_connection_options(tls)
    api = JetStreamApi(connect(options))
    api.create_stream({"name": "Mtls", "subjects": ["mtls.>"]})
    assert publish_all(api.conn, ((f"mtls.k{i}", f"m{i}".encode(), None) for i in range(100))).count == 100
    df = spark.readStream.format("jetstream").options(**tls, stream="Mtls").load()
    query = (
        df.writeStream.format("memory")
        .queryName("mtls_read")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert sorted(r.seq for r in spark.sql("select seq from mtls_read").collect()) == list(range(1, 101))
    shown = [df._jdf.queryExecution().toString(), query._jsq.explainInternal(True), str(query.recentProgress)]
    body = key.splitlines()[1]  # a line of the key's base64
    assert "keysecret" in shown[0].lower() and not [text for text in shown if body in text or "PRIVATE KEY" in text]
    api.delete_stream("Mtls")
    disconnect(options)


def _open_files() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def test_mutual_tls_with_the_key_as_text(mtls_server, pki):
    """``tls.keySecret``: the PEM text reaches OpenSSL through an in-memory file, closed again; a wrong text is
    refused naming the option, never quoting the key."""
    key = Path(pki["client.key"]).read_text()
    raw = {"servers": mtls_server.url, "tls.ca": pki["ca.pem"], "tls.cert": pki["client.pem"], "tls.keySecret": key}
    options = parse_connection_options(raw)
    assert key not in repr(options)
    assert JetStreamApi(connect(options)).account_info()["type"].endswith("account_info_response")
    disconnect(options)
    assert not [fd for fd in _open_files() if "spark-jetstream-key" in fd], "the in-memory key file was left open"
    broken = key.replace(key.splitlines()[2], "A" * len(key.splitlines()[2]))
    with pytest.raises(ConnectError, match=r"Cannot load the TLS files named by tls.ca/tls.cert/tls.keySecret") as e:
        connect(parse_connection_options({**raw, "tls.keySecret": broken, "connectTimeout": "2s"}))
    assert "PRIVATE KEY" not in str(e.value) and broken.splitlines()[2] not in str(e.value)
    with pytest.raises(OptionError, match=r"^Set tls.key or tls.keySecret, not both\.$"):
        parse_connection_options({**raw, "tls.key": pki["client.key"]})


def test_half_a_client_certificate_is_refused_before_connecting(pki):
    with pytest.raises(ConnectError, match="Set both tls.cert and tls.key"):
        connect(ConnectionOptions(servers=("nats://127.0.0.1:1",), tls_ca=pki["ca.pem"], tls_cert=pki["client.pem"]))


def test_unreadable_tls_files_are_named(tmp_path):
    with pytest.raises(ConnectError, match="Cannot load the TLS files named by tls.ca/tls.cert/tls.key"):
        connect(ConnectionOptions(servers=("nats://127.0.0.1:1",), tls_ca=str(tmp_path / "missing.pem")))


TOKEN = "tok-Plain-Ri9ht-5521"


@pytest.fixture(scope="module")
def plain_token_server() -> Iterator[EmbeddedServer]:
    """A server without TLS that takes TOKEN and traces every protocol line it receives."""
    with EmbeddedServer({"authorization": {"token": TOKEN}, "trace": True}, name="plain") as server:
        yield server


def connects(server: EmbeddedServer) -> int:
    """The CONNECT commands carrying a token (TOKEN: nothing else here has one) the server received: its trace logs
    each. Not every CONNECT: a Spark Python worker's cached connection to an earlier module's server keeps
    reconnecting to its port, which a later server may be given (seen in the full suite)."""
    lines = Path(server.dir, "server.log").read_text(errors="replace").splitlines()
    return sum("<<- [CONNECT" in line and '"auth_token"' in line for line in lines)


def test_the_plain_servers_trace_shows_every_connect(plain_token_server):
    """The oracle of the tests below: a connection that sends its token shows up as a CONNECT."""
    before = connects(plain_token_server)
    options = ConnectionOptions(servers=(plain_token_server.url,), token=TOKEN)
    assert JetStreamApi(connect(options)).account_info()["type"].endswith("account_info_response")
    disconnect(options)
    assert connects(plain_token_server) == before + 1


def _tls_asked(how: str, server: EmbeddedServer, pki: dict[str, str]) -> dict[str, str]:
    if how == "tls-url":
        return {"servers": server.url.replace("nats://", "tls://")}
    return {"servers": server.url, "tls.ca": pki["ca.pem"]}


def _fail(path: str, options: dict[str, str], spark: Any, tmp_path: Path) -> str:
    """Run ``path`` (a Spark read or write, or a command) with ``options``; the error it shows the user."""
    if path in ("cli", "demo"):
        secrets = {name: value for name, value in options.items() if name in ("token", "password")}  # from env vars
        args = [f"--{name.replace('.', '-')}={value}" for name, value in options.items() if name not in secrets]
        args += [f"--{name}-env=SJ_{name.upper()}" for name in secrets]
        env = {**os.environ, **{f"SJ_{name.upper()}": value for name, value in secrets.items()}}
        command = ["status", "--stream", "S", "--group", "g"] if path == "cli" else ["demo", "--out", str(tmp_path)]
        done = subprocess.run(
            ["spark-jetstream", *command, *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 2, done.stdout + done.stderr
        return done.stderr
    with pytest.raises(Exception) as caught:
        if path == "stream":
            df = spark.readStream.format("jetstream").options(**options, stream="S", group="g").load()
            df.writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start().awaitTermination(60)
        elif path == "batch":
            spark.read.format("jetstream").options(**options, stream="S").load().collect()
        else:
            df = spark.createDataFrame([("s.a", "x")], "subject string, data string")
            df.write.format("jetstream").options(**options).mode("append").save()
    return error_text(caught.value)


@pytest.mark.parametrize(
    ("path", "how"),
    [(path, how) for path in ("connect", "stream", "batch", "write", "cli") for how in ("tls-url", "tls-ca")]
    + [("demo", "tls-url")],  # the demo takes --servers and --creds only
)
def test_tls_asked_for_is_never_downgraded(path, how, plain_token_server, pki, spark, tmp_path):
    """TLS asked for, a server that offers none: an error naming the server, and no CONNECT (credentials) sent."""
    options = {**_tls_asked(how, plain_token_server, pki), "token": TOKEN}
    if path == "demo":
        del options["token"]
    before = connects(plain_token_server)
    started = time.monotonic()
    if path == "connect":
        with pytest.raises(ConnectError) as caught:
            connect(parse_connection_options(options))
        shown = str(caught.value)
    else:
        shown = _fail(path, options, spark, tmp_path)
    scheme = "tls" if how == "tls-url" else "nats"
    assert (
        f"The NATS server at {scheme}://127.0.0.1:{plain_token_server.port} offers no TLS, but TLS was asked for "
        "(a tls:// URL or a tls.* option): nothing was sent to it. Enable TLS on that server, or check the servers "
        "option." in shown
    ), shown
    assert time.monotonic() - started < 60
    assert connects(plain_token_server) == before
    assert TOKEN not in shown


def test_a_server_that_offers_tls_without_requiring_it_is_asked_for_it(pki):
    """``allow_non_tls``: the server's INFO says tls_available; TLS asked for upgrades the connection."""
    import json
    import urllib.request

    tls = {"cert_file": pki["server.pem"], "key_file": pki["server.key"]}
    with EmbeddedServer({"tls": tls, "allow_non_tls": True}, name="mixed") as server:
        options = ConnectionOptions(servers=(server.url,), tls_ca=pki["ca.pem"])
        assert JetStreamApi(connect(options)).account_info()["type"].endswith("account_info_response")
        with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/connz") as response:
            connections = json.load(response)["connections"]
        disconnect(options)
    assert [c.get("tls_version") for c in connections if c.get("name") == "spark-jetstream"] == ["1.3"]


@pytest.mark.slow
def test_every_path_works_over_tls(tls_server, pki, spark, tmp_path):
    from spark_jetstream.client.publish import publish_all
    from spark_jetstream.groups.layout import partitioned_stream_config

    tls = {"servers": tls_server.url, "tls.ca": pki["ca.pem"]}
    options = parse_connection_options(tls)
    api = JetStreamApi(connect(options))
    api.create_stream(partitioned_stream_config("Tls", "tls.*", 2))
    assert publish_all(api.conn, ((f"tls.k{i}", f"m{i}".encode(), None) for i in range(200))).count == 200

    streamed = (
        spark.readStream.format("jetstream")
        .options(**tls, stream="Tls", group="tg")
        .load()
        .writeStream.format("memory")
        .queryName("tls_read")
        .trigger(availableNow=True)
        .start()
    )
    streamed.awaitTermination(120)
    assert spark.sql("select count(distinct seq) from tls_read").first()[0] == 200
    batch = spark.read.format("jetstream").options(**tls, stream="Tls").load()
    assert batch.count() == 200
    batch.selectExpr("concat('tls.again', seq) as subject", "data").write.format("jetstream").options(**tls).mode(
        "append"
    ).save()
    assert api.stream_info("Tls")["state"]["messages"] == 400
    args = ["--servers", tls_server.url, "--tls-ca", pki["ca.pem"], "--stream", "Tls", "--group", "tg"]
    shown = subprocess.run(["spark-jetstream", "status", *args], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert [line.split()[:2] for line in shown.stdout.splitlines()[1:]] == [["0", "tg-0"], ["1", "tg-1"]]
    api.delete_stream("Tls")
    disconnect(options)


@pytest.mark.slow
def test_secrets_never_reach_errors_logs_plans_progress_the_checkpoint_or_the_cli(tmp_path):
    """Known secrets through every error path (each kind of credential, wrong ones, in the URL, a refused
    connection, a malformed URL, a server without TLS): the exception, Spark's wrapped error, the driver
    log (Spark and the connector at DEBUG) and the command line's output show the cause but never the secret."""
    import json
    import sys

    import nkeys

    from spark_jetstream.client.publish import publish_all
    from spark_jetstream.errors import JetStreamError
    from spark_jetstream.groups.layout import partitioned_stream_config
    from spark_jetstream.testing import free_port

    keys = tmp_path / "keys"
    keys.mkdir()
    _, _, nkey_seed = _nkey(nkeys.PREFIX_BYTE_USER)
    (keys / "user.nk").write_bytes(nkey_seed)
    signer, _, _ = _nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    _, user_public, creds_seed = _nkey(nkeys.PREFIX_BYTE_USER)
    creds_jwt = _jwt(signer, user_public, "stranger", _USER)
    _creds(keys / "user.creds", creds_jwt, creds_seed)
    password = "pw-Sekr1t-7731"
    _, spark_public, spark_seed = _nkey(nkeys.PREFIX_BYTE_USER)  # the working query's nkeySecret
    users = [{"user": "alice", "password": password}, {"nkey": spark_public}]
    with EmbeddedServer({"authorization": {"users": users}}, name="sec") as server:
        host, url = server.url.removeprefix("nats://"), server.url
        refused = f"127.0.0.1:{free_port()}"
        cases: dict[str, tuple[dict[str, str], str]] = {
            "wrong-password": (
                {"user": "alice", "password": "pw-Wr0ng-1"},
                f"The NATS server at {url} refused the credentials (user/password): check the creds",
            ),
            "wrong-token": ({"token": "tok-Wr0ng-5582"}, f"The NATS server at {url} refused the credentials (token)"),
            "password-in-url": (
                {"servers": f"nats://alice:pw-InUrl-2@{host}"},
                f"The NATS server at nats://alice:***@{host} refused the credentials (user/password in the servers "
                "URL)",
            ),
            "token-in-url": (
                {"servers": f"nats://tok-InUrl-3@{host}"},
                f"The NATS server at nats://***@{host} refused the credentials (token in the servers URL)",
            ),
            "nkey": ({"nkey": str(keys / "user.nk")}, f"The NATS server at {url} refused the credentials (nkey)"),
            "creds": ({"creds": str(keys / "user.creds")}, f"The NATS server at {url} refused the credentials (creds)"),
            "nkey-secret": (
                {"nkeySecret": nkey_seed.decode()},
                f"The NATS server at {url} refused the credentials (nkeySecret)",
            ),
            "creds-secret": (
                {"credsSecret": (keys / "user.creds").read_text()},
                f"The NATS server at {url} refused the credentials (credsSecret)",
            ),
            "refused": (
                {"servers": f"nats://alice:pw-Refused-4@{refused}", "password": password, "connectTimeout": "1s"},
                f"Cannot reach a NATS server at nats://alice:***@{refused} within 1s: the connection was refused",
            ),
            "bad-url": (
                {"servers": f"nats//alice:pw-BadUrl-6@{host}", "token": "tok-BadUrl-7"},
                f"Option 'servers' has an invalid value 'nats//alice:***@{host}': 'nats//alice:***@{host}' is "
                "malformed",
            ),
            "no-tls": (
                {"servers": f"tls://{host}", "user": "alice", "password": password},
                f"The NATS server at tls://{host} offers no TLS, but TLS was asked for",
            ),
        }
        secrets = [password, nkey_seed.decode(), creds_seed.decode(), creds_jwt, spark_seed.decode()]
        secrets += ["pw-Wr0ng-1", "tok-Wr0ng-5582", "pw-InUrl-2", "tok-InUrl-3", "pw-Refused-4", "pw-BadUrl-6"]
        secrets += ["tok-BadUrl-7"]
        shown: list[str] = []

        for name, (options, says) in cases.items():  # the connector's own exception
            with pytest.raises(JetStreamError) as caught:
                connect(parse_connection_options({"servers": url, **options}))
            assert str(caught.value).startswith(says), name
            shown += [str(caught.value), repr(caught.value)]

        for name, (options, says) in cases.items():  # the command line
            given = {"servers": url, **options}
            from_env = [key for key in given if "Secret" in key or key in ("password", "token")]  # text via env vars
            args = [
                f"--{key}={value}" for key, value in given.items() if key != "connectTimeout" and key not in from_env
            ]
            env = {f"SJ_{key.upper()}": given[key] for key in from_env}
            args += [f"--{key.replace('Secret', '-secret')}-env=SJ_{key.upper()}" for key in from_env]
            done = subprocess.run(
                ["spark-jetstream", "status", "--stream", "Sec", "--group", "g", *args],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, **env},
            )
            assert done.returncode == 2 and done.stderr.startswith(f"error: {says[:40]}"), (name, done.stderr)
            shown.append(done.stdout + done.stderr)

        working = ConnectionOptions(servers=(url,), user="alice", password=password)
        secured = JetStreamApi(connect(working))
        secured.create_stream(partitioned_stream_config("Sec", "sec.*", 2))
        publish_all(secured.conn, ((f"sec.k{i}", b"x", None) for i in range(200)))
        spec = {
            "options": {"servers": url, "stream": "Sec", "group": "g", "nkeySecret": spark_seed.decode()},
            "checkpoint": str(tmp_path / "cp"),
            "failing": {name: {"servers": url, "stream": "Sec", "group": "g", **o} for name, (o, _) in cases.items()},
        }
        (keys / "spec.json").write_text(json.dumps(spec))
        job = Path(__file__).parent / "jobs" / "secret_job.py"
        done = subprocess.run(
            [sys.executable, str(job), str(keys / "spec.json")], capture_output=True, text=True, timeout=600
        )
        disconnect(working)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "PLAN" in output and "EXPLAIN" in output and "numInputRows" in output
    for name, (_, says) in cases.items():  # Spark's wrapped errors of batch and streaming reads
        for kind in ("batch", "stream"):
            after = output.split(f"ERROR {name} {kind} ", 1)
            assert len(after) == 2 and says in after[1][:5000], (name, kind)
    shown.append(output)
    for secret in secrets:
        for text in shown:
            assert secret not in text, secret
        for path in tmp_path.rglob("*"):
            if path.is_file() and keys not in path.parents:
                assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
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
        as_text = parse_connection_options({"servers": server.url, "nkeySecret": seed.decode()})  # e.g. from a vault
        assert seed.decode() not in repr(as_text) and as_text.describe_auth() == "nkeySecret"
        assert JetStreamApi(connect(as_text)).account_info()["type"].endswith("account_info_response")
        disconnect(as_text)
        with pytest.raises(ConnectError, match=r"^Option 'nkeySecret' holds no valid nkey seed: check") as caught:
            connect(parse_connection_options({"servers": server.url, "nkeySecret": seed.decode()[:-3] + "xyz"}))
        assert seed.decode()[:20] not in str(caught.value)


def _nkey(prefix: int) -> tuple[Any, str, bytes]:
    """A fresh nkey: (key pair, public key, seed)."""
    import os

    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), prefix)
    pair = nkeys.from_seed(bytearray(seed))
    return pair, pair.public_key.decode(), seed


def _jwt(signer: Any, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A JWT as nats-io/jwt v2 encodes it: ed25519-nkey signature, jti = base32(sha512/256) of the
    standard claims with an empty jti. Built here so the test needs no nsc or Go tooling."""
    import base64
    import hashlib
    import json

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    standard = {"iat": int(time.time()), "iss": signer.public_key.decode(), "name": name, "sub": subject}
    digest = hashlib.new("sha512_256", json.dumps(standard, separators=(",", ":")).encode()).digest()
    claims = {"jti": base64.b32encode(digest).decode().rstrip("="), **standard, "nats": {**nats, "version": 2}}
    header = json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode()
    signed = b64(header) + "." + b64(json.dumps(claims, separators=(",", ":")).encode())
    return signed + "." + b64(signer.sign(signed.encode()))


def _creds(path: Path, user_jwt: str, seed: bytes) -> Path:
    """A .creds file in the layout nsc and nats-io/jwt's FormatUserConfig write."""
    path.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )
    return path


_UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
              "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}  # fmt: skip
_USER = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user"}


@dataclass
class OperatorMode:
    """A server in operator (JWT) mode, a creds file of a user it trusts, and one of a user it does not."""

    server: EmbeddedServer
    creds: Path
    stranger: Path
    secrets: tuple[str, ...]


@pytest.fixture(scope="module")
def operator_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorMode]:
    import nkeys

    d = tmp_path_factory.mktemp("jwt")
    operator, operator_pub, _ = _nkey(nkeys.PREFIX_BYTE_OPERATOR)
    _, system_pub, _ = _nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    account, account_pub, _ = _nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    _, user_pub, user_seed = _nkey(nkeys.PREFIX_BYTE_USER)
    # The stranger's account is signed by the same operator but never given to the server's resolver.
    unknown, _, _ = _nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    _, stranger_pub, stranger_seed = _nkey(nkeys.PREFIX_BYTE_USER)
    user_jwt = _jwt(account, user_pub, "spark", _USER)
    stranger_jwt = _jwt(unknown, stranger_pub, "stranger", _USER)
    config = {
        "operator": _jwt(operator, operator_pub, "op", {"type": "operator", "system_account": system_pub}),
        "system_account": system_pub,  # JetStream will not start in operator mode without one
        "resolver": "MEMORY",
        "resolver_preload": {
            system_pub: _jwt(operator, system_pub, "SYS", {"type": "account"}),
            account_pub: _jwt(operator, account_pub, "app", {"type": "account", "limits": _UNLIMITED}),
        },
    }
    with EmbeddedServer(config, name="jwt") as server:
        yield OperatorMode(
            server=server,
            creds=_creds(d / "spark.creds", user_jwt, user_seed),
            stranger=_creds(d / "stranger.creds", stranger_jwt, stranger_seed),
            secrets=(user_seed.decode(), user_jwt, stranger_seed.decode(), stranger_jwt),
        )


@pytest.mark.slow
def test_creds_authentication_reads_through_spark(operator_mode, spark):
    from spark_jetstream.client.publish import publish_all
    from spark_jetstream.groups.layout import member_consumer_config, partition_filters, partitioned_stream_config

    url, creds = operator_mode.server.url, str(operator_mode.creds)
    options = ConnectionOptions(servers=(url,), creds=creds)
    api = JetStreamApi(connect(options))
    assert api.account_info()["limits"]["max_storage"] == -1  # JetStream enabled for the JWT account
    api.create_stream(partitioned_stream_config("Creds", "creds.*", 2))
    for p in range(2):
        api.create_consumer("Creds", member_consumer_config("cg", str(p), partition_filters([p])))
    published = publish_all(api.conn, ((f"creds.k{i}", f"m{i}".encode(), None) for i in range(300)))
    assert published.count == 300

    common = {"servers": url, "creds": creds, "stream": "Creds"}
    batch = spark.read.format("jetstream").options(**common).load()
    assert sorted(r.seq for r in batch.select("seq").collect()) == list(range(1, 301))
    text = operator_mode.creds.read_text()  # as a vault hands it out: credsSecret
    streamed_df = (
        spark.readStream.format("jetstream").options(servers=url, credsSecret=text, stream="Creds", group="cg").load()
    )
    query = streamed_df.writeStream.format("memory").queryName("creds_read").trigger(availableNow=True).start()
    query.awaitTermination()
    shown = [streamed_df._jdf.queryExecution().toString(), query._jsq.explainInternal(True), str(query.recentProgress)]
    assert "credsSecret" in shown[0] or "credssecret" in shown[0].lower()  # the option is there, its value is not
    for secret in operator_mode.secrets[:2]:
        assert not [s for s in shown if secret in s]
    streamed = spark.sql("select seq, data from creds_read").collect()
    assert sorted((r.seq, bytes(r.data)) for r in streamed) == [(i + 1, f"m{i}".encode()) for i in range(300)]
    floors = {api.consumer_info("Creds", f"cg-{p}")["ack_floor"]["stream_seq"] for p in range(2)}
    assert floors == {300}  # the pull reader and the commit both ran as the creds user
    disconnect(options)


def test_creds_of_an_unknown_account_are_refused_fast_without_leaking(operator_mode):
    started = time.monotonic()
    with pytest.raises(ConnectError, match="refused the credentials \\(creds\\)") as caught:
        connect(
            ConnectionOptions(servers=(operator_mode.server.url,), creds=str(operator_mode.stranger), connect_timeout=5)
        )
    elapsed = time.monotonic() - started
    assert elapsed < 3, f"refused creds took {elapsed:.1f}s, connectTimeout is 5s"
    assert "Account fetch failed: account missing" in operator_mode.server.log_tail(20)  # refused for the account
    message = str(caught.value)
    assert "creds" in message
    for secret in operator_mode.secrets:
        assert secret not in message and secret not in repr(caught.value)


@pytest.mark.slow
def test_the_demo_on_a_server_that_needs_creds_then_status_of_the_group_it_derived(operator_mode, tmp_path):
    """`spark-jetstream demo --servers ... --creds ... --keep`: the driver, the executors and the publisher all use
    them, no embedded server is started, nothing secret is printed; then `status --creds` shows the kept group's
    members at the last seq."""
    url, creds = operator_mode.server.url, str(operator_mode.creds)
    done = subprocess.run(
        ["spark-jetstream", "demo", "--servers", url, "--creds", creds, "--stream", "demo_kept", "--keep",
         "--messages", "2000", "--rate", "0", "--partitions", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    options = ConnectionOptions(servers=(url,), creds=creds)
    api = JetStreamApi(connect(options))
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "OK: published 2,000 orders; Spark read 2,000 rows" in done.stdout
        assert "nats-server at" not in done.stdout  # no embedded server was started
        for secret in operator_mode.secrets:
            assert secret not in done.stdout + done.stderr
        assert sorted(api.consumer_names("demo_kept")) == ["demo-0", "demo-1"]  # the read-only pass has no group
        shown = subprocess.run(
            ["spark-jetstream", "status", "--servers", url, "--creds", creds,
             "--stream", "demo_kept", "--group", "demo"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        rows = [line.split() for line in shown.stdout.splitlines()[1:]]
        assert [(r[0], r[1], r[2]) for r in rows] == [("0", "demo-0", "0"), ("1", "demo-1", "1")]
        assert {int(r[-3]) for r in rows} == {2000}  # ack floors at the last seq, nothing pending, no lag
        assert {(int(r[-2]), int(r[-1])) for r in rows} == {(0, 0)}
    finally:
        api.delete_stream("demo_kept")
        disconnect(options)


STREAM_READER_PERMISSIONS = {
    # Another user who may read the stream ORDERS with a consumer of its own, "analyst", but may not
    # pull from (or UNPIN, RESET, change, delete) Spark's member consumers: every subject it may
    # publish to is listed, and nothing names a member consumer. (Consumer names are one subject
    # token, so "all but Spark's" cannot be written as a wildcard: allow the user's own instead.)
    "publish": {
        "allow": [
            "$JS.API.INFO",
            "$JS.API.STREAM.INFO.ORDERS",
            "$JS.API.DIRECT.GET.ORDERS",
            "$JS.API.CONSUMER.CREATE.ORDERS.analyst",
            "$JS.API.CONSUMER.CREATE.ORDERS.analyst.>",
            "$JS.API.CONSUMER.INFO.ORDERS.analyst",
            "$JS.API.CONSUMER.MSG.NEXT.ORDERS.analyst",
            "$JS.ACK.ORDERS.analyst.>",
        ]
    },
    "subscribe": {"allow": ["_INBOX.>"]},
}


@pytest.mark.slow
def test_a_reader_of_the_stream_cannot_pull_from_the_spark_groups_member_consumers(spark, tmp_path):
    """The permissions recipe of README "Security": the Spark user reads the group; the other user
    reads the stream through its own consumer, and the server refuses its pulls on Spark's."""
    import asyncio
    import json

    import nats

    from spark_jetstream.client.publish import publish_all
    from spark_jetstream.groups.layout import partitioned_stream_config

    users = {
        "users": [
            {"user": "spark", "password": "spark-pw", "permissions": {"publish": ">", "subscribe": ">"}},
            {"user": "analyst", "password": "analyst-pw", "permissions": STREAM_READER_PERMISSIONS},
        ]
    }
    with EmbeddedServer({"authorization": users}, name="perms") as server:
        spark_options = ConnectionOptions(servers=(server.url,), user="spark", password="spark-pw")
        api = JetStreamApi(connect(spark_options))
        api.create_stream(partitioned_stream_config("ORDERS", "orders.*", 2))
        assert publish_all(api.conn, ((f"orders.k{i}", b"o", None) for i in range(100))).count == 100
        query = (
            spark.readStream.format("jetstream")
            .options(servers=server.url, user="spark", password="spark-pw", stream="ORDERS", group="spark-orders")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert sum(p.numInputRows for p in query.recentProgress) == 100
        members = [f"spark-orders-{p}" for p in range(2)]
        assert {api.consumer_info("ORDERS", m)["ack_floor"]["stream_seq"] for m in members} == {100}

        async def as_analyst() -> tuple[list[str], int, int]:
            refused: list[str] = []

            async def on_error(error: Exception) -> None:
                refused.append(str(error))

            nc = await nats.connect(server.url, user="analyst", password="analyst-pw", error_cb=on_error)
            for member in members:  # a standby's pull, and a pull that takes over the pin
                pull = {"batch": 10, "expires": 1_000_000_000, "group": "PCG"}
                for verb in ("MSG.NEXT", "UNPIN", "RESET"):
                    with contextlib.suppress(nats.errors.TimeoutError):
                        await nc.request(f"$JS.API.CONSUMER.{verb}.ORDERS.{member}", json.dumps(pull).encode(), 1.5)
            own = await nc.jetstream().pull_subscribe("*.orders.*", durable="analyst", stream="ORDERS")
            read = len(await own.fetch(100, timeout=5))
            first = await nc.request("$JS.API.DIRECT.GET.ORDERS", b'{"seq": 1}')
            await nc.close()
            return refused, read, int(first.headers["Nats-Sequence"])

        refused, read, direct = asyncio.run(as_analyst())
        violations = [r for r in refused if "permissions violation" in r.lower()]
        for member in members:
            for verb in ("msg.next", "unpin", "reset"):  # nats-py reports the subject in lower case
                assert any(f'"$js.api.consumer.{verb}.orders.{member}"' in v for v in violations), refused
        assert (read, direct) == (100, 1)  # the analyst does read the stream, through its own consumer
        for member in members:  # nothing reached the analyst from Spark's consumers, nothing moved
            info = api.consumer_info("ORDERS", member)
            assert info["ack_floor"]["stream_seq"] == 100 and info["num_ack_pending"] == 0
        disconnect(spark_options)
