"""The connector on every supported PySpark minor, and installed without PySpark.

Each older PySpark runs in a venv of its own (kept between runs under ``SPARK_JETSTREAM_VENVS``,
default ``~/.cache/spark-jetstream/venvs``; the JVM jars come with the PyPI package) into which
the connector's wheel, built from this checkout, is installed. ``tests/jobs/compat_job.py`` runs
the main uses there; this module checks their outcomes with the suite's own PySpark and server.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from chispa import assert_df_equality
from helpers import (
    KILL_CHAIN,
    ack_floors,
    checkpoint_log,
    checkpoint_option,
    class_archive_path,
    expected_rows,
    interpreter,
    kill_chain,
    pip,
    spark_home,
    stored,
    venv,
)

from spark_jetstream.client.protocol import NO_EXTENSIONS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
JOB = Path(__file__).parent / "jobs" / "compat_job.py"
PARQUET_JOB = Path(__file__).parent / "jobs" / "stream_to_parquet.py"
OLDER_PYSPARKS = (("4.0.5", "3.12", "wheel"), ("4.1.4", "3.13", "source"), ("4.2.1", "3.11", "wheel"))
"""The newest patch of each supported minor before the suite's own (4.3), each with a Python and a way to install
the connector: PySpark 4.0 on 3.12 with the wheel built on 3.11 (Databricks Runtime 17: Spark 4.0, Python 3.12, a
wheel built elsewhere), 4.1 on 3.13 from the checkout (built there, the compiled parser too), 4.2 on the suite's
3.11. Spark's workers run the venv's Python, as its driver does (PySpark refuses a worker of another minor)."""


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The connector's wheel, built from this checkout and repaired to a ``manylinux`` tag as the README says (a
    package index refuses ``linux_x86_64``)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    built = next(out.glob("spark_jetstream-*.whl"))
    repair = [sys.executable, "-m", "auditwheel", "repair", "-w", str(out / "index"), str(built)]
    subprocess.run(repair, check=True, capture_output=True)
    return next((out / "index").glob("spark_jetstream-*.whl"))


def test_the_wheel_carries_a_manylinux_tag_and_the_compiled_parser(wheel):
    """What a package index takes: auditwheel checked the symbols the extension needs (glibc only) and named the
    oldest manylinux that has them; the extension is in it, for CPython 3.11 and later (the stable ABI)."""
    assert re.fullmatch(r"spark_jetstream-[\d.]+-cp311-abi3-manylinux\S*_x86_64\.whl", wheel.name), wheel.name
    shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True)
    assert 'is consistent with the following platform tag:\n"manylinux_' in shown.stdout, shown.stdout + shown.stderr
    import zipfile

    with zipfile.ZipFile(wheel) as opened:
        assert "spark_jetstream/client/_speedups.abi3.so" in opened.namelist()


def pyspark_venv(version: str, minor: str, install: str, wheel: Path) -> Path:
    """A venv of CPython ``minor`` with PySpark ``version`` and the connector, from ``wheel`` or (``source``) built
    from this checkout by that Python; skips where this machine has no such Python."""
    base = interpreter(minor)
    if base is None:
        pytest.skip(f"no CPython {minor} here (looked on PATH and in pyenv's versions): install it to run this test")
    requirements = (f"pyspark=={version}", "nats-py[nkeys]>=2.16,<2.17", "pyarrow>=15")
    python = venv(f"pyspark-{version}-py{minor}", *requirements, base=base)
    pip(python, "--no-deps", "--force-reinstall", str(wheel if install == "wheel" else ROOT))
    return python


def older_pyspark_env(python: Path, version: str) -> tuple[dict[str, str], Callable[[], None]]:
    """The environment for a job on PySpark ``version`` in ``python``'s venv: its Spark home, checkpoint file manager
    and class archive, not the suite's; and what to call once the job passed, which keeps the archive its JVM wrote at
    exit when there was none yet. The archive saves each later run's cold JVM about a fifth of its CPU (decision
    0035)."""
    pyspark_dir = next(python.parent.parent.glob("lib/python*/site-packages/pyspark"))
    home = spark_home(pyspark_dir)
    suites = checkpoint_option(Path(importlib.util.find_spec("pyspark").origin).parent)
    options = os.environ.get("JAVA_TOOL_OPTIONS", "").replace(suites, checkpoint_option(pyspark_dir))
    archive = class_archive_path(version, home)
    partial = None
    if archive is not None and "-XX:SharedArchiveFile=" in options:  # the suite's options (a developer's are kept)
        partial = None if archive.exists() else archive.with_name(f".{archive.name}.{os.getpid()}")
        use = f"-XX:ArchiveClassesAtExit={partial}" if partial else f"-XX:SharedArchiveFile={archive}"
        options = re.sub(r"-XX:SharedArchiveFile=\S+", use, options)

    def keep() -> None:
        if archive is not None and partial is not None and partial.exists():
            partial.replace(archive)

    env = {key: value for key, value in os.environ.items() if key != NO_EXTENSIONS}  # the parser a user's install has
    return {**env, "SPARK_HOME": str(home), "PYSPARK_PYTHON": str(python), "JAVA_TOOL_OPTIONS": options}, keep


@pytest.mark.parametrize(("version", "minor", "install"), OLDER_PYSPARKS, ids=lambda value: value)
def test_streaming_batch_and_write_on_older_pyspark(
    version, minor, install, wheel, spark, nats_server, api, make_stream, tmp_path
):
    python = pyspark_venv(version, minor, install, wheel)
    count, cap = 900, 300  # three capped batches: a run stopped after two, a restart for the third
    stream = make_stream(count, partitions=3, headers=True)
    api.create_stream({"name": f"COPY_{stream.name}", "subjects": [f"copy{stream.name}.>"]})
    atomic = f"acopy{stream.name}"
    api.create_stream(
        {"name": f"ACOPY_{stream.name}", "subjects": [f"{atomic}.>", f"{atomic}_progress.>"], "allow_atomic": True}
    )
    env, keep_archive = older_pyspark_env(python, version)
    done = subprocess.run(
        [str(python), str(JOB), "--servers", nats_server.url, "--stream", stream.name, "--group-prefix", stream.group,
         "--max", str(cap), "--count", str(count), "--out", str(tmp_path), "--target", f"copy{stream.name}"],
        capture_output=True, text=True, timeout=600, cwd="/", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    keep_archive()
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["pyspark"] == version
    # The driver and every Python worker ran this Python, parsing with the compiled handlers.
    assert seen["python"] == minor
    assert seen["workers"] == [f"{minor} compiled"], seen["workers"]

    def output(name: str):
        return spark.read.parquet(str(tmp_path / name / "out")).select("subject", "data", "seq", "partition")

    everything = expected_rows(spark, stream)
    # A capped streaming read, stopped and restarted: every batch planned was committed, each within the cap (the
    # stream's seqs have no gaps), every row once.
    assert_df_equality(output("capped"), everything, ignore_row_order=True, ignore_nullable=True)
    offsets = checkpoint_log(tmp_path / "capped" / "cp", "offsets")
    assert checkpoint_log(tmp_path / "capped" / "cp", "commits").keys() == offsets.keys()
    ends = [offsets[batch] for batch in sorted(offsets)]
    sizes = [end - start for start, end in itertools.pairwise([0, *ends])]
    assert sum(sizes) == count and max(sizes) <= cap and ends[-1] == stream.last_seq, sizes
    # Only PySpark >= 4.2 asks the source for the stream's end (the progress's latestOffset, for lag): the first
    # batch's progress reports it; before, it reports the batch's own end. (The first run may read all three
    # batches on a fast machine, so the last batch's end says nothing.)
    first = {int(seq) for seq in re.findall(r"""["']seq["']: (\d+)""", seen["reported_latest"][0])}
    assert first == {stream.last_seq if version >= "4.2" else cap}, seen["reported_latest"]
    # The lag of the first batch: the stream's end was known when it was planned (4.0/4.1 report no latest offset).
    assert seen["lags"][0] == count - cap, seen["lags"]
    # Spark acks a batch while it plans the next: the last one is acked when the query next starts.
    capped_floors = set(ack_floors(api, dataclasses.replace(stream, group=f"{stream.group}-capped")).values())
    assert capped_floors <= set(offsets.values())

    # availableNow reads what was there when it started: in batches within the cap on PySpark >= 4.2,
    # in one batch before (Spark's single-batch fallback; the cap then bounds that one batch).
    assert_df_equality(output("available_now"), everything, ignore_row_order=True, ignore_nullable=True)
    # Before 4.2 Spark calls the source neither after that batch nor when the query stops: its ack
    # waits for the next run (which acks at its first latestOffset).
    now_floors = ack_floors(api, dataclasses.replace(stream, group=f"{stream.group}-now"))
    assert set(now_floors.values()) == {stream.last_seq if version >= "4.2" else 0}
    assert seen["available_now_min"] == [count]  # fewer messages than the minimum: read all the same
    if version >= "4.2":
        assert sum(seen["available_now_capped"]) == count and max(seen["available_now_capped"]) <= cap
    else:
        assert seen["available_now"] == [count]
        assert seen["available_now_capped"] == [cap]

    # Without a group: the checkpoint alone holds the position, on every version.
    assert_df_equality(output("groupless"), everything, ignore_row_order=True, ignore_nullable=True)
    assert seen["groupless"] == [count]

    bounded = spark.createDataFrame(
        [(s, p, seq, part) for seq, (s, p, _, part) in stream.messages.items() if 10 < seq <= 110],
        "subject string, data binary, seq long, partition int",
    )
    assert_df_equality(output("batch"), bounded, ignore_row_order=True, ignore_nullable=True)

    # The copy ran twice on one checkpoint: every message stored once, with its headers.
    copied = stored(api, f"COPY_{stream.name}")
    assert len(copied) == count
    expected = sorted(
        (f"copy{stream.name}.{subject.split('.')[-1]}", data, {k: [v] for k, v in headers.items()})
        for subject, data, headers, _ in stream.messages.values()
    )
    got = sorted(
        (subject, data, {k: v for k, v in h.items() if not k.startswith("Nats-")}) for _, subject, data, h in copied
    )
    assert got == expected
    # The same copy with progress markers: every row once (no msg ids), and a marker per batch of 99 rows.
    acopied = stored(api, f"ACOPY_{stream.name}")
    rows = [
        (s, d, {k: v for k, v in h.items() if not k.startswith("Nats-")})
        for _, s, d, h in acopied
        if s.startswith(f"{atomic}.")
    ]
    assert sorted(rows) == sorted((f"a{s}", d, h) for s, d, h in expected)
    assert all("Nats-Msg-Id" not in h for _, s, _, h in acopied)
    assert len(acopied) - len(rows) >= count // 99


@pytest.mark.parametrize(("version", "minor", "install"), OLDER_PYSPARKS[:2], ids=lambda value: value)
def test_every_restart_path_on_older_pyspark(
    version, minor, install, wheel, spark, nats_server, api, make_stream, tmp_path
):
    """``test_faults.py``'s kill chain on PySpark 4.0 and 4.1 (but ``commit``: a floor moved and others not is the
    reconciliation's case, the same on every version), whose restarts differ from 4.2+'s: Spark calls
    ``partitions(latest, latest)`` before anything else, then ``initialOffset`` for batch 0's start (a restart in batch
    0 once read it as empty: its rows were lost and, on a WorkQueue stream, purged by the next commit). Finished there
    by an ``availableNow`` run (Spark's single-batch fallback): every message once, the floors where 4.0 and 4.1 leave
    them (the last batch is acked when the next run starts)."""
    python = pyspark_venv(version, minor, install, wheel)
    env, keep_archive = older_pyspark_env(python, version)
    stream = make_stream(3000, partitions=3, retention="workqueue")
    out, checkpoint = tmp_path / "out", tmp_path / "cp"
    args = [str(python), str(PARQUET_JOB), "--servers", nats_server.url, "--stream", stream.name,
            "--group", stream.group, "--out", str(out), "--checkpoint", str(checkpoint),
            "--max-per-trigger", "500"]  # fmt: skip
    points = tuple(point for point in KILL_CHAIN if not point.startswith("commit"))  # commit: version-free
    kill_chain(args, points, tmp_path, env)
    assert checkpoint_log(checkpoint, "offsets").keys() == checkpoint_log(checkpoint, "commits").keys() == {0, 1, 2}
    done = subprocess.run(
        [*args, "--available-now", "--max-per-trigger", "100000"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    keep_archive()
    output = spark.read.parquet(str(out)).select("subject", "data", "seq", "partition")
    assert_df_equality(output, expected_rows(spark, stream), ignore_row_order=True, ignore_nullable=True)
    offsets = checkpoint_log(checkpoint, "offsets")
    assert offsets[max(offsets)] == stream.last_seq
    assert set(ack_floors(api, stream).values()) == {offsets[max(offsets) - 1]}


def test_the_connector_installs_and_imports_without_pyspark_and_says_what_it_needs(wheel):
    python = venv("no-pyspark", "pip>=23")
    pip(python, "--force-reinstall", str(wheel))
    listed = subprocess.run([str(python), "-m", "pip", "list"], capture_output=True, text=True, check=True).stdout
    assert "pyspark" not in listed.lower()
    probe = (
        "import spark_jetstream\n"
        "print('imported', spark_jetstream.__version__)\n"
        "from spark_jetstream.client.protocol import compiled_parsers\n"
        "print('parsers', compiled_parsers()[0].name)\n"
        "try:\n"
        "    import pyspark_jetstream\n"
        "except ImportError as exc:\n"
        "    print('error', type(exc).__name__, exc)\n"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    assert "imported 0." in done.stdout
    assert "parsers compiled" in done.stdout  # the manylinux wheel's extension loads in a fresh venv
    assert (
        "error SparkVersionError spark-jetstream needs PySpark 4.0 or newer, and none is installed in this Python "
        "environment: run it where Spark provides PySpark (Databricks, spark-submit), or pip install "
        "'pyspark>=4.0,<5'." in done.stdout
    )


def test_a_pyspark_older_than_4_is_named_with_the_version_needed(wheel, tmp_path):
    """PySpark 3.5 stands in as its version number: the check reads nothing else."""
    python = venv("no-pyspark", "pip>=23")
    pip(python, "--force-reinstall", str(wheel))
    (tmp_path / "pyspark").mkdir()
    (tmp_path / "pyspark" / "__init__.py").write_text('__version__ = "3.5.8"\n')
    done = subprocess.run(
        [str(python), "-c", "import spark_jetstream; spark_jetstream.register(None)"],
        capture_output=True, text=True, cwd="/", env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        "SparkVersionError: spark-jetstream needs PySpark 4.0 or newer (Python data sources), but PySpark 3.5.8 is "
        "installed" in done.stderr
    )
