"""What a new user meets first: ``pip install '.[demo]' && spark-jetstream demo`` (issue 31)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spark_jetstream.errors import JetStreamError
from spark_jetstream.tools import demo


def test_a_failed_warm_up_is_one_line_and_not_the_demos_failure(capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(source: type) -> None:
        raise RuntimeError("[PACKAGE_NOT_INSTALLED] Something >= 1 must be installed.\n  JVM stack trace ...")

    spark = SimpleNamespace(
        sparkContext=SimpleNamespace(defaultParallelism=2), dataSource=SimpleNamespace(register=refuse)
    )
    warm_up = demo.WorkerWarmUp(spark)  # type: ignore[arg-type]
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
