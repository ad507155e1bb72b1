"""A Spark Python worker's long-lived objects kept out of the garbage collector's full collections.

Spark's daemon runs ``gc.collect()`` after every task of a reused Python worker. A full collection walks every object
the process holds: Spark's, pyarrow's, nats-py's and the connector's modules, the cached connection, about 50,000
objects, 14-24 ms a collection on the project's 2-core machine. With a task per partition and batch that was most of
the workers' CPU of a streaming read (decision 0046). ``settle`` freezes what the worker holds once, at its first task
(after a collection of what was garbage then): later collections walk only what tasks made since, and objects still
go when their last reference does.
"""

from __future__ import annotations

import gc

_settled = False


def settle() -> None:
    """Freeze the worker's objects once per process, in a Spark task only: a driver's or a user's process keeps its
    collector as it is."""
    global _settled
    if _settled or not in_spark_task():
        return
    gc.collect()
    gc.freeze()
    _settled = True


def in_spark_task() -> bool:
    """Whether this runs in a Spark task (a Python worker), not on the driver."""
    from pyspark import TaskContext

    return TaskContext.get() is not None
