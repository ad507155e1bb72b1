"""JetStream lag per micro-batch, from Spark's own progress events, and a plot of a run.

Spark reports each source's ``endOffset`` (where the batch ended) and ``latestOffset`` (what the
source reported through ``reportLatestOffset``: the stream's last sequence when the batch was
planned). For this source both are ``{"seq": ..., "stream": ...}``, so the lag of a batch is the
number of stream sequences between them: messages stored but not yet in any batch. PySpark 4.0 and
4.1 report the batch's end as the latest offset; the end offset carries the stream's last sequence
when the batch was planned (``last``), which gives the lag there too.

    listener = JetStreamLagListener(on_batch=lambda b: print(b.batch_id, b.rows, b.lag))
    spark.streams.addListener(listener)
    ...
    listener.plot("run.png")
"""

from __future__ import annotations

import ast
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener


@dataclass(frozen=True)
class BatchProgress:
    """One micro-batch of one query as seen by the listener."""

    query: str  # the query's name, or its id when it has none
    batch_id: int
    at: float  # epoch seconds when the batch started
    rows: int
    input_rate: float  # rows/s arriving, as Spark computes it
    processed_rate: float  # rows/s processed by this batch
    duration_ms: int
    end_seq: int | None  # the JetStream source's end offset; None if the query has no such source
    latest_seq: int | None

    @property
    def lag(self) -> int | None:
        """Stream sequences stored but not read when the batch was planned."""
        if self.end_seq is None or self.latest_seq is None:
            return None
        return max(0, self.latest_seq - self.end_seq)


def _seq(offset: str | None, field: str = "seq") -> int | None:
    """``field`` of a JetStream source's offset (None: not such an offset, or no such field). A listener's event
    holds the offset's JSON; ``query.recentProgress`` (parsed from JSON by PySpark) holds its Python ``str``."""
    try:
        parsed = json.loads(offset) if offset else None
    except ValueError:
        try:
            parsed = ast.literal_eval(offset or "")
        except (ValueError, SyntaxError):
            return None
    if isinstance(parsed, dict) and "seq" in parsed and "stream" in parsed and parsed.get(field) is not None:
        return int(parsed[field])
    return None


def batch_progress(progress: Any) -> BatchProgress:
    """A ``BatchProgress`` from a ``StreamingQueryProgress`` (the event's ``progress``)."""
    end = latest = None
    for source in progress.sources:
        end_seq = _seq(source.endOffset)
        if end_seq is not None:  # the first JetStream source of the query
            reported = [_seq(source.latestOffset), _seq(source.endOffset, "last")]
            end, latest = end_seq, max((seq for seq in reported if seq is not None), default=None)
            break
    started = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
    return BatchProgress(
        query=progress.name or str(progress.id),
        batch_id=progress.batchId,
        at=started,
        rows=progress.numInputRows,
        input_rate=float(progress.inputRowsPerSecond or 0.0),
        processed_rate=float(progress.processedRowsPerSecond or 0.0),
        duration_ms=int(progress.durationMs.get("triggerExecution", 0)),
        end_seq=end,
        latest_seq=latest,
    )


class JetStreamLagListener(StreamingQueryListener):
    """Keeps a ``BatchProgress`` per micro-batch of every query (idle polls are not batches)."""

    def __init__(self, on_batch: Callable[[BatchProgress], None] | None = None) -> None:
        self.on_batch = on_batch
        self._lock = threading.Lock()
        self._batches: list[BatchProgress] = []

    @property
    def batches(self) -> list[BatchProgress]:
        with self._lock:
            return list(self._batches)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        batch = batch_progress(event.progress)
        with self._lock:
            self._batches.append(batch)
        if self.on_batch is not None:
            self.on_batch(batch)

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def plot(self, path: str | Path, title: str = "spark-jetstream") -> Path:
        return plot_batches(self.batches, path, title)


def plot_batches(batches: Sequence[BatchProgress], path: str | Path, title: str = "spark-jetstream") -> Path:
    """Save throughput (rows/s) and lag (messages) over the run as a PNG; needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "Plotting needs matplotlib: pip install 'spark-jetstream[demo]' (or pip install matplotlib)."
        ) from None
    batches = sorted((b for b in batches if b.rows or b.lag), key=lambda b: b.at)
    start = batches[0].at if batches else time.time()
    seconds = [b.at - start for b in batches]
    figure, (rate_axis, lag_axis) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    rate_axis.plot(seconds, [b.processed_rate for b in batches], marker="o", label="processed rows/s")
    rate_axis.plot(seconds, [b.input_rate for b in batches], marker=".", linestyle="--", label="input rows/s")
    rate_axis.set_ylabel("rows/s")
    rate_axis.legend(loc="upper right")
    rate_axis.set_title(title)
    lag_axis.plot(seconds, [b.lag or 0 for b in batches], marker="o", color="tab:red")
    lag_axis.set_ylabel("lag (messages)")
    lag_axis.set_xlabel("seconds since the first batch")
    for axis in (rate_axis, lag_axis):
        axis.grid(alpha=0.3)
        axis.set_ylim(bottom=0)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
