"""What a new user meets first: ``pip install '.[demo]' && spark-jetstream demo``.

The suite's own venv has the ``test`` extra, which installs packages (pandas) that the ``demo`` extra does not: what
the demo needs is only seen from a venv with nothing but ``.[demo]``. That venv is made once per module from a copy of
the working tree without build leftovers (a fresh clone); pip's cache keeps the install to seconds after the first.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spark_jetstream.errors import JetStreamError
from spark_jetstream.tools import demo, demo_orders, worker_warmup


def test_a_failed_warm_up_is_one_line_and_not_the_demos_failure(capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(source: type) -> None:
        raise RuntimeError("[PACKAGE_NOT_INSTALLED] Something >= 1 must be installed.\n  JVM stack trace ...")

    spark = SimpleNamespace(
        sparkContext=SimpleNamespace(defaultParallelism=2), dataSource=SimpleNamespace(register=refuse)
    )
    warm_up = worker_warmup.WorkerWarmUp(spark)  # type: ignore[arg-type]
    warm_up.start()
    warm_up.join(10)
    assert warm_up.failure == "[PACKAGE_NOT_INSTALLED] Something >= 1 must be installed."
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err


class FakeTracker:
    """Spark's status tracker as ``_before_first_batch`` reads it: one query's jobs and their stages."""

    def __init__(self, stages: dict[int, tuple[int, int]]) -> None:
        self.stages = stages  # stage id -> (tasks, completed)

    def getJobIdsForGroup(self, group: str) -> list[int]:
        return [7] if group == "run-1" and self.stages else []

    def getJobInfo(self, job: int) -> Any:
        return SimpleNamespace(stageIds=list(self.stages))

    def getStageInfo(self, stage: int) -> Any:
        tasks, done = self.stages[stage]
        return SimpleNamespace(numTasks=tasks, numCompletedTasks=done)


def phase(checkpoint: Path, stages: dict[int, tuple[int, int]], warming: bool = False) -> str:
    spark = SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: FakeTracker(stages)))
    return demo._before_first_batch(spark, SimpleNamespace(runId="run-1"), checkpoint, warming)  # type: ignore[arg-type]


def test_the_status_before_the_first_batch_says_what_spark_is_doing(tmp_path: Path) -> None:
    assert phase(tmp_path, {}, warming=True) == "starting the query and Spark's Python workers"
    assert phase(tmp_path, {}) == "starting the query"
    (tmp_path / "offsets").mkdir()
    offset = '{"created": "2026-11-25T10:46:55.556219799Z", "seq": 25000, "stream": "demo_orders"}'
    (tmp_path / "offsets" / "0").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{offset}\n')
    assert phase(tmp_path, {}) == "planning batch 0 (25,000 messages)"
    assert phase(tmp_path, {3: (4, 1)}) == "reading batch 0 (25,000 messages): 1 of 4 partitions read"
    assert (
        phase(tmp_path, {3: (4, 4), 4: (1, 0)}) == "batch 0 read (25,000 messages): from_json, aggregate, parquet write"
    )


def test_the_demo_refuses_an_out_directory_of_an_earlier_run(tmp_path: Path) -> None:
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    with pytest.raises(JetStreamError, match=r"holds an earlier demo run \(checkpoint\): use a new --out directory"):
        demo.run(servers="nats://127.0.0.1:1", out=str(tmp_path))


ROOT = Path(__file__).parent.parent
MESSAGES = 6000
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", "spark-warehouse"
)
"""What a fresh clone lacks: a stale ``build/`` would put files into the wheel that the tree no longer has."""
HOST_PYTHON_SETTINGS = (
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_HOME",
    "PYTHONPATH",
    "PYTHONHOME",
    "JAVA_TOOL_OPTIONS",
)
"""Settings that would make the demo's Spark use the suite's Python, PySpark or JVM flags instead of a user's."""


def user_env(venv: Path, tmp: Path) -> dict[str, str]:
    """A user's environment with the venv activated; temp dirs (the demo's output, the server's store) in ``tmp``."""
    env = {k: v for k, v in os.environ.items() if k not in HOST_PYTHON_SETTINGS}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", TMPDIR=str(tmp))
    return env


@pytest.fixture(scope="module")
def demo_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv (no system site-packages) holding ``.[demo]``, installed from the tree the way the README says.

    Two differences that change what is installed in nothing the demo uses, and save about half the install's CPU
    (measured: 34 -> 17 CPU s): the suite's own pip installs into the venv (``--python``) instead of one installed
    there first, and it writes no bytecode (``--no-compile``: the demo's processes compile what they import)."""
    base = tmp_path_factory.mktemp("first-run")
    clone, venv = base / "spark-jetstream", base / "venv"
    shutil.copytree(ROOT, clone, ignore=NOT_IN_A_CLONE)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-compile",
            f"{clone}[demo]",
        ],
        env=user_env(venv, base),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


@pytest.mark.slow
def test_the_demo_from_a_fresh_venv_with_only_the_demo_extra(demo_venv: Path, tmp_path: Path) -> None:
    """Exit 0, the exact totals, the connector's read speed, and no traceback anywhere (a pandas one, once)."""
    has_pandas = subprocess.run([str(demo_venv / "bin" / "python"), "-c", "import pandas"], capture_output=True)
    assert has_pandas.returncode != 0, "the demo extra is expected not to install pandas: this test is about that"

    done = subprocess.run(  # the user's command, on a smaller load (the default publishes for 10 s)
        ["spark-jetstream", "demo", "--messages", str(MESSAGES), "--rate", "3000", "--max-per-batch", "1500"],
        env=user_env(demo_venv, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "Traceback" not in out and "Traceback" not in done.stderr, out + done.stderr
    assert "not warmed up" not in out, out  # the warm-up needs nothing the demo extra lacks
    assert not re.search(r"\d\d:\d\d:\d\d (WARN|ERROR)", done.stderr), done.stderr  # a quiet run

    # The totals, from the demo's own order generator: every region's orders and revenue, exactly.
    totals = demo_orders.Totals()
    for _ in demo_orders.orders(MESSAGES, totals):
        pass
    for region in totals.orders:
        count, revenue = totals.orders[region], totals.revenue_cents[region] / 100
        expected = rf"\n  {region}\s+{count:,}\s+{revenue:,.2f}\s+{count:,} / {revenue:,.2f}  ok\n"
        assert re.search(expected, out), out
    assert f"OK: published {MESSAGES:,} orders; Spark read {MESSAGES:,} rows in " in out
    assert f"(and {MESSAGES:,} in the read-only pass); revenue by region matches exactly; ack floors equal" in out
    for member in ("demo-0", "demo-1", "demo-2", "demo-3"):
        assert re.search(rf"{member}\s+{MESSAGES:,}\s+ok", out), out

    # The status line says what Spark does before the first batch, never a frozen "read 0".
    status = [line for line in out.splitlines() if re.match(r"\s+\d+\.\ds  ", line)]
    assert "starting the query" in status[0], status
    assert not [line for line in status if re.search(r"read\s+0 ", line)], status
    assert re.search(rf"batch\s+\d+\s+published\s+{MESSAGES:,}\s+read\s+{MESSAGES:,} .* lag\s+0", out), out
    # The summary: the pipeline's pace, then the connector alone on the same stream.
    assert re.search(r"first batch: [\d,]+ rows, finished \d+\.\ds after the query started", out), out
    assert re.search(r"Spark processed [\d,]+ rows/s \(read, from_json, aggregate, parquet write\)", out), out
    stored = r"\([\d.]+ MB as stored\)"
    read_only = (
        rf"read-only pass .*: {MESSAGES:,} rows {stored} in 1 batch of [\d,]+ ms: the connector read [\d,]+ rows/s, "
        r"[\d.]+ MB/s"
    )
    assert re.search(read_only, out), out
    outputs = [
        Path(line.split(":", 1)[1].strip()) for line in out.splitlines() if line.startswith(("Output:", "Plot:"))
    ]
    assert len(outputs) == 2 and all(tmp_path in path.parents for path in outputs), out
    assert len(list(outputs[0].glob("batch_id=*"))) >= 4  # at most 1,500 rows per batch
    png = outputs[1].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
