"""A connector task freezes its Spark Python worker's long-lived objects once (``worker_heap``), so the full collection
Spark's daemon runs after every task walks only what later tasks made; a driver's process is left as it is. (What it
saves is measured by a benchmark, decision 0046.)"""

from __future__ import annotations

import subprocess
import sys

SETTLED = """
import gc
from pyspark import TaskContext
from spark_jetstream.worker_heap import settle
if {in_task}:
    TaskContext._setTaskContext(TaskContext())  # as a Spark Python worker has while it runs a task
settle()
first = gc.get_freeze_count()
settle()
print(first, gc.get_freeze_count())
"""


def freeze_counts(in_task: bool) -> list[int]:
    code = SETTLED.format(in_task=in_task)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return [int(count) for count in done.stdout.split()]


def test_settling_freezes_a_tasks_process_once_and_leaves_any_other_alone():
    first, second = freeze_counts(in_task=True)
    assert first > 10_000  # the imported modules' objects, out of the collector's walks
    assert second == first  # once per process
    assert freeze_counts(in_task=False) == [0, 0]


def test_a_read_task_settles_its_worker_before_it_reads(monkeypatch):
    """``read_ranges`` (every read task, streaming and batch) settles the worker's heap first, in a task only."""
    import spark_jetstream.read.tasks as tasks
    import spark_jetstream.worker_heap as worker_heap
    from spark_jetstream.read.ranges import SmallBatch

    calls: list[bool] = []
    monkeypatch.setattr(tasks, "settle", lambda: calls.append(worker_heap.in_spark_task()))
    for in_task in (True, False):
        monkeypatch.setattr(worker_heap, "in_spark_task", lambda answer=in_task: answer)
        assert list(tasks.read_ranges(None, SmallBatch(ranges=()))) == []  # type: ignore[arg-type]
    assert calls == [True, False]
