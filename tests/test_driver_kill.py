"""A streaming job's driver SIGKILLed mid-batch and restarted on its checkpoint: every message once in the
output, and every member consumer's ack floor at the last seq.

The job runs as a process of its own (``tests/jobs/stream_to_parquet.py``) so the kill takes its whole driver; the
restart runs in the test's session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from chispa import assert_df_equality
from helpers import ack_floors, checkpoint_log, expected_rows, finish_job, mid_batch, run_then_kill

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "stream_to_parquet.py"


@pytest.mark.parametrize(
    ("ack_policy", "direct", "members", "read_mode"),
    [
        ("none", True, 0, "auto"),
        ("none", False, 0, "auto"),
        ("explicit", True, 3, "auto"),
    ],  # readMode=pull on a stream with Direct Get reads as the stream without it does (the second case)
)
def test_driver_killed_mid_batch_restarts_exactly_once(
    ack_policy, direct, members, read_mode, spark, nats_server, api, make_stream, tmp_path
):
    """Pulling with ``ackPolicy=none`` (a stream without Direct Get, or ``readMode=pull``), the kill waits until a
    floor ran ahead of the checkpoint (delivery is the ack there), so the restart must move it back and replay
    the batch. Direct Get reads never move a floor. ``members``: 3 members sharing 8 partitions unevenly (the explicit
    ack case: a member per partition reads and acks alike, only fewer partitions)."""
    stream = make_stream(6000, partitions=8 if members else 4, consumers=ack_policy, direct=direct)
    group = f"{stream.group}m{members}" if members else stream.group
    out, checkpoint = tmp_path / "out", tmp_path / "cp"
    pulls = not direct or read_mode == "pull"
    args = [sys.executable, str(JOB), "--servers", nats_server.url, "--stream", stream.name, "--group", group,
            "--out", str(out), "--checkpoint", str(checkpoint), "--ack-policy", ack_policy,
            "--read-mode", read_mode]  # fmt: skip
    if members:
        args += ["--members", str(members)]

    def committed() -> int:
        offsets, commits = checkpoint_log(checkpoint, "offsets"), checkpoint_log(checkpoint, "commits")
        return offsets[max(commits)] if commits else 0

    def ready() -> bool:
        return mid_batch(checkpoint) and (
            not pulls or ack_policy == "explicit" or max(ack_floors(api, stream).values(), default=0) > committed()
        )

    run_then_kill([*args, "--max-per-trigger", "1000", "--slow-ms", "2"], ready, 180)
    assert len(checkpoint_log(checkpoint, "commits")) < len(checkpoint_log(checkpoint, "offsets"))

    finish_job(spark, args)
    output = spark.read.parquet(str(out)).select("subject", "data", "seq", "partition")
    assert_df_equality(output, expected_rows(spark, stream), ignore_row_order=True, ignore_nullable=True)
    floors = ack_floors(api, stream, group)
    assert len(floors) == (members or 4) and set(floors.values()) == {stream.last_seq}
