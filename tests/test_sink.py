"""The jetstream writer end to end: real Spark, real nats-server, exact stream contents."""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest
from helpers import (
    add_messages,
    checkpoint_log,
    finish_job,
    kill_mid_batch,
    query_id_of,
    run_then_kill,
    sink_job,
    source_data,
    stored,
    wait_for_target_to_settle,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.sink.markers import read_marker

pytestmark = pytest.mark.slow

BUCKET = "spark-jetstream-commits"
_S = 1_000_000_000


def msg_ids(messages) -> list[str]:
    return [headers["Nats-Msg-Id"][0] for _, _, _, headers in messages]


def target(api: JetStreamApi, name: str, duplicate_window: float = 120.0, **extra: object) -> str:
    api.create_stream(
        {"name": name, "subjects": [f"{name.lower()}.>"], "duplicate_window": int(duplicate_window * _S), **extra}
    )
    return name


@pytest.fixture
def streams(api):
    made: list[str] = []

    def make(name: str, **kwargs: object) -> str:
        made.append(target(api, name, **kwargs))
        return name

    yield make
    for name in made:
        api.delete_stream(name)


def write(df: DataFrame, url: str, **options: object) -> None:
    df.write.format("jetstream").option("servers", url).options(**{k: str(v) for k, v in options.items()}).mode(
        "append"
    ).save()


def error_text(exc: BaseException) -> str:
    get_message = getattr(exc, "getMessage", None)
    return get_message() if callable(get_message) else str(exc)


# -- batch writes --------------------------------------------------------------------------------


def test_a_batch_write_stores_every_row_with_its_subject_data_headers_and_msg_id(spark, nats_server, api, streams):
    name = streams("W1")
    rows = [
        ("w1.a", b"\x00binary", {"k": ["1", "2"], "Trace": ["t-0"]}, "id-0"),
        ("w1.b", b"", None, None),
        ("w1.a", b"third", {"only": ["x"]}, None),
        ("w1.c.d", b"fourth", {}, "id-3"),
    ]
    df = spark.createDataFrame(rows, "subject string, data binary, headers map<string,array<string>>, msg_id string")
    write(df.coalesce(1), nats_server.url)
    messages = stored(api, name)
    assert [(s, d) for _, s, d, _ in messages] == [(r[0], r[1]) for r in rows]
    ids = msg_ids(messages)
    assert ids[0] == "id-0" and ids[3] == "id-3"
    assert re.fullmatch(r"[0-9a-f]{32}:0:1", ids[1]) and ids[2] == ids[1][:-1] + "2"  # <writeId>:<partition>:<row>
    assert [{k: v for k, v in h.items() if k != "Nats-Msg-Id"} for _, _, _, h in messages] == [
        {"k": ["1", "2"], "Trace": ["t-0"]},
        {},
        {"only": ["x"]},
        {},
    ]


def test_string_data_string_headers_and_the_subject_option(spark, nats_server, api, streams):
    name = streams("W2")
    df = spark.createDataFrame([("héllo", {"a": "b"}), ("", None)], "data string, headers map<string,string>")
    write(df.coalesce(1), nats_server.url, subject="w2.default", deduplicate="false")
    messages = stored(api, name)
    assert [(s, d, h) for _, s, d, h in messages] == [
        ("w2.default", "héllo".encode(), {"a": ["b"]}),
        ("w2.default", b"", {}),
    ]


def test_retried_tasks_of_a_batch_write_are_stored_once(spark, nats_server, api, streams):
    """A task fails after publishing about 700 of its 1000 rows; its retry publishes them again with
    the same msg ids. With deduplicate=false the same retry doubles those rows (the control)."""

    @F.udf(StringType())
    def payload_failing_first_attempt_late(i: int) -> str:
        from pyspark import TaskContext

        if i == 700 and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("injected failure after about 700 rows of this task were published")
        return f"{i}:" + "x" * 8000  # big rows: the UDF worker passes them on as they come

    df = spark.range(0, 2000, 1, 2).select(
        F.lit("w3.x").alias("subject"), payload_failing_first_attempt_late("id").alias("data")
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")  # rows reach the writer gradually
    try:
        name = streams("W3")
        write(df, nats_server.url)
        messages = stored(api, name)
        assert sorted(int(d.split(b":")[0]) for _, _, d, _ in messages) == list(range(2000))
        assert len(set(msg_ids(messages))) == 2000

        api.purge_stream(name)
        write(df, nats_server.url, deduplicate="false")
        data = [int(d.split(b":")[0]) for _, _, d, _ in stored(api, name)]
        assert set(data) == set(range(2000)) and len(data) > 2000  # the retried rows, twice
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        (lambda: [F.lit("w4.x").alias("subject")], {}, "The DataFrame has no 'data' column"),
        (
            lambda: [F.lit("w4.x").alias("subject"), F.col("id").alias("data")],
            {},
            "Column 'data' has type bigint, but the jetstream writer accepts binary or string: cast it.",
        ),
        (
            lambda: [F.col("id").alias("subject"), F.lit("x").alias("data")],
            {},
            "Column 'subject' has type bigint, but the jetstream writer accepts string",
        ),
        (lambda: [F.lit("x").alias("data")], {}, "The DataFrame has no 'subject' column and the subject option is not"),
        (
            lambda: [
                F.lit("w4.x").alias("subject"),
                F.lit("x").alias("data"),
                F.create_map(F.lit("k"), "id").alias("headers"),
            ],
            {},
            "Column 'headers' has type map<string,bigint>, but the jetstream writer accepts map<string,string> or "
            "map<string,array<string>>",
        ),
        (
            lambda: [F.lit("x").alias("data"), F.lit("w4.x").alias("subject"), F.col("id").alias("msg_id")],
            {},
            "Column 'msg_id' has type bigint, but the jetstream writer accepts string",
        ),
        (
            lambda: [F.lit("x").alias("data"), F.create_map(F.lit("k"), F.lit("v")).alias("header")],
            {"subject": "w4.x"},
            "Column 'header' is not used by the jetstream writer: did you mean 'headers'?",
        ),
        (lambda: [F.lit("x").alias("data")], {"subject": "w4.*"}, "Option 'subject' has an invalid value 'w4.*'"),
        (lambda: [F.lit("x").alias("data")], {"subject": "w4.x", "publishWindow": "1"}, "must be at least 2"),
    ],
    ids=[
        "no-data",
        "data-bigint",
        "subject-bigint",
        "no-subject",
        "headers-map-of-bigint",
        "msg-id-bigint",
        "typo-header",
        "wildcard-subject",
        "tiny-window",
    ],
)
def test_columns_and_options_are_checked_before_anything_is_published(
    spark, nats_server, api, streams, columns, options, message
):
    name = streams("W4")
    with pytest.raises(Exception) as caught:
        write(spark.range(5).select(*columns()), nats_server.url, **options)
    assert message in error_text(caught.value)
    assert api.stream_info(name)["state"]["messages"] == 0


def test_overwrite_mode_is_refused(spark, nats_server):
    df = spark.createDataFrame([("w.x", "d")], "subject string, data string")
    with pytest.raises(Exception) as caught:
        df.write.format("jetstream").option("servers", nats_server.url).mode("overwrite").save()
    assert "A JetStream stream cannot be overwritten: use .mode('append')" in error_text(caught.value)


def test_a_subject_no_stream_captures_fails_the_write_naming_it(spark, nats_server, api, streams):
    name = streams("W5")
    df = spark.createDataFrame(
        [("w5.ok", "1"), ("nowhere.x", "2"), ("w5.ok", "3")], "subject string, data string"
    ).coalesce(1)
    with pytest.raises(Exception) as caught:
        write(df, nats_server.url)
    assert "Publishing to 'nowhere.x' failed: 503" in error_text(caught.value)
    assert "no stream captures this subject" in error_text(caught.value)
    assert api.stream_info(name)["state"]["messages"] == 2  # the rows that could be stored, once each


def test_a_full_stream_with_discard_new_fails_the_write_and_keeps_what_it_stored(spark, nats_server, api, streams):
    name = streams("W6", max_msgs=50, discard="new")
    df = spark.range(100).select(
        F.format_string("w6.k%d", "id").alias("subject"), F.col("id").cast("string").alias("data")
    )
    with pytest.raises(Exception) as caught:
        write(df.coalesce(1), nats_server.url)
    text = error_text(caught.value)
    assert "Publishing to 'w6.k50' failed: maximum messages exceeded (error 10077)" in text
    assert [(s, d) for _, s, d, _ in stored(api, name)] == [(f"w6.k{i}", str(i).encode()) for i in range(50)]


def test_expected_stream_refuses_messages_another_stream_would_store(spark, nats_server, api, streams):
    streams("W7")
    df = spark.createDataFrame([("w7.x", "1")], "subject string, data string")
    with pytest.raises(Exception) as caught:
        write(df, nats_server.url, expectedStream="Elsewhere")
    assert "Publishing to 'w7.x' failed: expected stream does not match (error 10060)" in error_text(caught.value)
    write(df, nats_server.url, expectedStream="W7")
    assert api.stream_info("W7")["state"]["messages"] == 1


def test_a_streaming_write_error_fails_the_query_naming_the_subject(spark, nats_server, make_stream, tmp_path):
    source = make_stream(200, partitions=2)
    query = (
        spark.readStream.format("jetstream")
        .option("servers", nats_server.url)
        .option("stream", source.name)
        .option("group", source.group)
        .load()
        .select(F.lit("unrouted.x").alias("subject"), "data")
        .writeStream.format("jetstream")
        .option("servers", nats_server.url)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .queryName("unrouted")  # Spark passes it to the sink as option 'queryname': accepted
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as caught:
        query.awaitTermination(120)
    assert "Publishing to 'unrouted.x' failed: 503" in error_text(caught.value)


# -- streaming writes: kills, restarts, the duplicate window --------------------------------------


def test_a_query_killed_mid_batch_and_restarted_stores_each_row_once(
    spark, nats_server, api, make_stream, streams, tmp_path
):
    source = make_stream(6000, partitions=4)
    out = streams("Out1")  # duplicate window 2 min: the restart replays the batch well within it
    checkpoint = tmp_path / "cp"
    args = sink_job(nats_server.url, source, out, checkpoint)
    kill_mid_batch(args, api, out, checkpoint)
    assert len(checkpoint_log(checkpoint, "commits")) < len(checkpoint_log(checkpoint, "offsets"))

    finish_job(spark, args)
    messages = stored(api, out)
    assert len(messages) == 6000
    assert len(set(msg_ids(messages))) == 6000
    assert sorted(d for _, _, d, _ in messages) == source_data(source)


def test_a_committed_batch_replayed_after_the_duplicate_window_is_skipped_whole(
    spark, nats_server, api, conn, make_stream, streams, tmp_path
):
    source = make_stream(3000, partitions=4)
    out = streams("Out2", duplicate_window=1.0)
    checkpoint = tmp_path / "cp"
    args = sink_job(nats_server.url, source, out, checkpoint)
    finish_job(spark, args)
    assert len(stored(api, out)) == 3000
    # Crash between the sink's commit and Spark's commit log: the last batch is replayed on restart.
    last = max(checkpoint_log(checkpoint, "commits"))
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    assert read_marker(conn, BUCKET, query_id_of(checkpoint)) == last
    time.sleep(1.5)  # past the duplicate window: msg ids no longer protect the replay

    finish_job(spark, args)
    assert checkpoint_log(checkpoint, "commits").keys() == checkpoint_log(checkpoint, "offsets").keys()
    messages = stored(api, out)
    assert len(messages) == 3000
    assert sorted(d for _, _, d, _ in messages) == source_data(source)
    again = publish_all(conn, [(messages[0][1], b"x", {"Nats-Msg-Id": msg_ids(messages)[0]})])
    assert again.duplicates == 0  # the window had passed indeed


def test_after_the_duplicate_window_an_uncommitted_batch_repeats_what_it_had_published(
    spark, nats_server, api, conn, make_stream, streams, tmp_path
):
    """The documented limit, exactly: a batch that was published in part but not committed, replayed
    after the stream's duplicate window, stores again what it had published; nothing is lost, and
    committed batches are not repeated."""
    source = make_stream(6000, partitions=4)
    out = streams("Out3", duplicate_window=1.0)
    checkpoint = tmp_path / "cp"
    args = sink_job(nats_server.url, source, out, checkpoint)
    kill_mid_batch(args, api, out, checkpoint)

    query, batch = query_id_of(checkpoint), max(checkpoint_log(checkpoint, "offsets"))
    before = msg_ids(stored(api, out))
    committed = read_marker(conn, BUCKET, query) >= batch  # the sink committed it just before the kill
    repeated = set() if committed else {i for i in before if i.startswith(f"{query}:{batch}:")}
    time.sleep(1.5)

    finish_job(spark, args)
    after = Counter(msg_ids(stored(api, out)))
    assert len(after) == 6000  # nothing lost
    assert sum(after.values()) == 6000 + len(repeated)
    assert {i for i, n in after.items() if n > 1} == repeated


@pytest.mark.parametrize("progress", [False, True], ids=["msg-ids", "progress-markers"])
def test_batches_replayed_after_the_stream_and_the_group_changed_store_each_row_once(
    progress, spark, nats_server, api, conn, make_stream, tmp_path
):
    """Two kills mid-write, each followed by a change that would cut the uncommitted batch otherwise if it were planned
    anew: larger messages (a one-task batch by the stream's average size becomes a task per partition) and Direct Get
    turned off (``readMode=auto`` pulls a task per member then); a third member (the group's layout). Each replay is
    cut as its first attempt was (decision 0042): the msg ids (``<query>:<batch>:<partition>:<row>``) and the progress
    markers (rows of a partition stored) name the same rows, and every source row is in the target once."""
    source = make_stream(2500, partitions=4)
    out = f"REPLAY{int(progress)}"
    extra = {"subjects": [f"{out.lower()}.>", f"{out.lower()}_progress.>"], "allow_atomic": True} if progress else {}
    target(api, out, **extra)
    checkpoint = tmp_path / "cp"
    options = ["--source-option", "recordBatchBytes=150000"]  # 1,000 messages of ~60 B: one task
    if progress:
        options += ["--progress-subject", f"{out.lower()}_progress", "--atomic-batch-size", "100"]

    def kill_mid_batch_after(args: list[str], batch: int) -> None:
        """``helpers.kill_mid_batch``, for a batch after ``batch`` (the replay of the one left comes first)."""

        def partly_published() -> bool:
            offsets, commits = checkpoint_log(checkpoint, "offsets"), checkpoint_log(checkpoint, "commits")
            if not commits or max(offsets) <= batch or max(commits) >= max(offsets):
                return False
            written = api.stream_info(out)["state"]["messages"]
            return offsets[max(commits)] + 50 < written - (written // 100 if progress else 0) < offsets[max(offsets)]

        run_then_kill([*args, "--max-per-trigger", "1000", "--slow-ms", "3"], partly_published, 240, poll=0.02)
        wait_for_target_to_settle(api, out)

    try:
        first = sink_job(nats_server.url, source, out, checkpoint, *options, "--source-option", "members=2")
        kill_mid_batch_after(first, -1)
        left = max(checkpoint_log(checkpoint, "offsets"))
        add_messages(conn, source, 1000, seed=9, size=lambda i: 1500)  # the average size grows 8-fold
        config = api.stream_info(source.name)["config"]
        api.call(("STREAM", "UPDATE", source.name), {**config, "allow_direct": False}, "Turning Direct Get off")

        kill_mid_batch_after(first, left)
        last = max(checkpoint_log(checkpoint, "offsets"))
        planned = json.loads((checkpoint / "offsets" / str(last)).read_text().splitlines()[2])
        assert last > left and planned["cut"]["pull"]  # a batch after the replay, a task per member, half written
        third = sink_job(nats_server.url, source, out, checkpoint, *options, "--source-option", "members=3")
        finish_job(spark, third)
    finally:
        messages = stored(api, out)
        api.delete_stream(out)
    rows = [(s, d, h) for _, s, d, h in messages if s.startswith(f"{out.lower()}.")]
    stored_rows, expected = Counter(d for _, d, _ in rows), Counter(source_data(source))
    missing, doubled = expected - stored_rows, stored_rows - expected
    assert not missing and not doubled, f"{sum(missing.values())} rows missing, {sum(doubled.values())} doubled"
    if not progress:
        assert len({h["Nats-Msg-Id"][0] for _, _, h in rows}) == len(rows)
