# Databricks notebook source
# MAGIC %md
# MAGIC # spark-jetstream quick start
# MAGIC
# MAGIC Read NATS JetStream with Spark and write back to it, in about ten minutes:
# MAGIC
# MAGIC 1. configure: a NATS server, names, a Spark session
# MAGIC 2. create a partitioned stream and a consumer group, publish order events
# MAGIC 3. a bounded batch read
# MAGIC 4. a streaming read with an aggregate, and the group's ack floors against the checkpoint
# MAGIC 5. write back to JetStream, exactly once
# MAGIC 6. a KV bucket as a table, and its changes
# MAGIC 7. clean up
# MAGIC
# MAGIC Needs Databricks Runtime 17 or later (Apache Spark 4.0+), classic or serverless, a NATS server (2.14.5 or
# MAGIC later, with JetStream) that the compute can reach, and a Unity Catalog volume for the wheel and the checkpoints.
# MAGIC
# MAGIC Where the package goes: the `%pip install` cell below installs it for this notebook, on every kind of compute.
# MAGIC On serverless compute and on clusters in standard (shared) access mode, Spark runs behind Spark Connect: the
# MAGIC notebook-scoped library reaches the Python workers, and `spark_jetstream.register(spark)` (in the next cell)
# MAGIC makes `format("jetstream")` known. For a job on a classic cluster, add the wheel as a cluster or job library
# MAGIC instead. spark-jetstream is not on a public index yet: build its `manylinux` wheel from a checkout (README,
# MAGIC Installing), upload it to a Unity Catalog volume and put its path in the cell below. The runtime's own
# MAGIC PySpark stays: the package does not install one.

# COMMAND ----------

# MAGIC %pip install /Volumes/main/w/v/spark_jetstream-0.1.0-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. Configure
# MAGIC
# MAGIC Fill in the widgets at the top: the URL of a NATS server the cluster can reach (the default comes from the
# MAGIC cluster's `NATS_URL` environment variable) and a folder in a Unity Catalog volume,
# MAGIC `/Volumes/<catalog>/<schema>/<volume>/...`, for the checkpoints and the KV part's table (delete it when done).

# COMMAND ----------

# ruff: noqa: E402, F821
# (Databricks notebooks import in later cells, and `spark` and `dbutils` are predefined.)
import os

import spark_jetstream

dbutils.widgets.text("nats_url", os.environ.get("NATS_URL", "nats://localhost:4222"), "NATS server URL")
dbutils.widgets.text("work_dir", "/Volumes/main/default/checkpoints/jetstream-quickstart", "Checkpoint folder")

STREAM = "quickstart-orders"  # order events, partitioned by customer
GROUP = "spark-orders"  # the consumer group the streaming query reads with
OUT_STREAM = "quickstart-large-orders"  # what part 5 writes back to
PARTITIONS = 4

embedded = None  # no embedded server here: the cluster must reach NATS_URL
NATS_URL = dbutils.widgets.get("nats_url")

# Connection options for every read and write: add "creds", "user" and "password", "tls.ca", ... here
# (secrets from dbutils.secrets.get).
NATS = {"servers": NATS_URL}

WORK_DIR = dbutils.widgets.get("work_dir").rstrip("/")


def list_dir(path):
    """The names in a folder, sorted ([] when there is none), with dbutils.fs: it reads volumes on every compute."""
    try:
        return sorted(entry.name.rstrip("/") for entry in dbutils.fs.ls(path))
    except Exception as exc:  # dbutils.fs.ls raises on a folder that does not exist
        if "FileNotFoundException" in str(exc) or "does not exist" in str(exc):
            return []
        raise


spark.conf.set("spark.sql.shuffle.partitions", "4")
spark_jetstream.register(spark)  # the library was installed after Spark started: register format("jetstream")
print(f"Spark {spark.version}, NATS at {NATS_URL}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. A partitioned stream, a consumer group, and some orders
# MAGIC
# MAGIC The stream stores `shop.orders.<customer>` as `<p>.shop.orders.<customer>`, where the partition `p` is a hash
# MAGIC of the customer: one customer's orders stay in order within one partition. A consumer group splits the
# MAGIC partitions among its members, whose consumers keep the group's position (their ack floors). The streaming read
# MAGIC below uses Direct Get (the default where the stream allows it): a task per partition with messages in the batch,
# MAGIC or one task for a small batch; with `readMode=pull`, each member is one Spark input partition. Groups are stored
# MAGIC as Synadia's `pcgroups` stores them. From a shell, the same group is
# MAGIC `spark-jetstream group create --stream quickstart-orders --group spark-orders --max-members 4 --members a b`.

# COMMAND ----------

from spark_jetstream import JetStreamAdmin

admin = JetStreamAdmin(NATS)  # streams and groups from Python, over the same connection options
admin.create_partitioned_stream(STREAM, "shop.orders.*", PARTITIONS)
mapping = admin.create_group(STREAM, GROUP, members=["a", "b"], max_members=PARTITIONS)
print("stored as:", admin.stream_info(STREAM)["config"]["subject_transform"]["dest"])
print("member -> partitions:", mapping)

# COMMAND ----------

# MAGIC %md
# MAGIC Publish 2,000 order events (JSON) with the batch writer: one message per row, from the `subject` and
# MAGIC `data` columns. The `msg_id` column becomes the `Nats-Msg-Id` header, so running this cell again within the
# MAGIC stream's duplicate window (2 minutes by default) stores nothing twice. From plain Python,
# MAGIC nats-py (installed with the connector) publishes too.

# COMMAND ----------

import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

rng = random.Random(42)
customers = {f"c{n:03d}": rng.choice(["DE", "FR", "NL", "PL", "US"]) for n in range(200)}
opened = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)
orders = []
for order_id in range(1, 2001):
    customer = rng.choice(sorted(customers))
    orders.append(
        {
            "order_id": order_id,
            "customer": customer,
            "country": customers[customer],
            "sku": f"sku-{rng.randrange(40):02d}",
            "quantity": rng.randint(1, 5),
            "price": round(rng.uniform(2, 150), 2),
            "ts": (opened + timedelta(seconds=7 * order_id)).isoformat(),
        }
    )

rows = [(f"shop.orders.{o['customer']}", json.dumps(o), f"order-{o['order_id']}") for o in orders]
events = spark.createDataFrame(rows, "subject string, data string, msg_id string")
events.write.format("jetstream").options(**NATS).mode("append").save()

revenue = sum(Decimal(f"{o['price']:.2f}") * o["quantity"] for o in orders)
print(f"published {len(orders)} orders, revenue {revenue}")
print(f"stream {STREAM} holds {admin.stream_info(STREAM)['state']['messages']} messages")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. Batch read
# MAGIC
# MAGIC `spark.read` reads a fixed range of the stream (by default everything there is when the query is planned).
# MAGIC It uses Direct Get and never touches the group's consumers. Every row carries the message's subject (without
# MAGIC the partition number), its payload, the stream sequence, the time it was stored and its partition.

# COMMAND ----------

from pyspark.sql import functions as F

snapshot = spark.read.format("jetstream").options(**NATS).option("stream", STREAM).load()
snapshot.printSchema()
snapshot.select("subject", "partition", "seq", "timestamp", F.col("data").cast("string").alias("data")).show(
    3, truncate=60
)
snapshot.groupBy("partition").count().orderBy("partition").show()

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Streaming read
# MAGIC
# MAGIC A micro-batch is a range of stream sequences, so a replayed batch reads exactly the same messages. Here:
# MAGIC parse the JSON with `from_json`, total the orders per country into a memory table, and stop when everything
# MAGIC that is in the stream now has been read (`trigger(availableNow=True)`). For a real pipeline, write to
# MAGIC Parquet or Delta instead (append mode), with the checkpoint on durable storage.

# COMMAND ----------

ORDER = "order_id BIGINT, customer STRING, country STRING, sku STRING, quantity INT, price DECIMAL(10,2), ts TIMESTAMP"


def parse_orders(messages):
    """JetStream rows -> one column per order field, plus the message's partition and seq."""
    parsed = messages.select(F.from_json(F.col("data").cast("string"), ORDER).alias("order"), "partition", "seq")
    return parsed.select("order.*", "partition", "seq")


orders_stream = parse_orders(
    spark.readStream.format("jetstream")
    .options(**NATS)
    .option("stream", STREAM)
    .option("group", GROUP)
    .option("maxMessagesPerTrigger", 1000)  # at most 1,000 messages per micro-batch
    .load()
)
by_country = orders_stream.groupBy("country").agg(
    F.count("*").alias("orders"),
    F.sum("quantity").alias("items"),
    F.sum(F.col("price") * F.col("quantity")).alias("revenue"),
)
query = (
    by_country.writeStream.format("memory")
    .queryName("revenue_by_country")
    .outputMode("complete")
    .option("checkpointLocation", f"{WORK_DIR}/revenue_by_country")
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()

spark.table("revenue_by_country").orderBy("country").show()
totals = spark.table("revenue_by_country").agg(F.sum("orders"), F.sum("revenue")).first()
print(f"streamed {totals[0]} orders, revenue {totals[1]}")

# COMMAND ----------

# MAGIC %md
# MAGIC The query's progress: each source offset is the stream sequence `seq` the batch read up to (and how the
# MAGIC batch was cut, for its replay).

# COMMAND ----------

from spark_jetstream import batch_progress

for progress in query.recentProgress:  # attributes: the same on classic compute and on Spark Connect
    print(f"batch {progress.batchId}: {progress.numInputRows} rows")
last = batch_progress(query.lastProgress)  # the source's end offset and the lag, from Spark's progress
print(f"last batch: {last.rows} rows, up to seq {last.end_seq}, {last.lag} messages behind")

# COMMAND ----------

# MAGIC %md
# MAGIC ### Running it as a pipeline
# MAGIC
# MAGIC On a cluster that runs all the time, leave out the trigger (or use `trigger(processingTime="10 seconds")`):
# MAGIC the query then reads new messages as they arrive. Serverless compute runs streaming queries with
# MAGIC `trigger(availableNow=True)` only: schedule the notebook or job, and each run reads what arrived since the
# MAGIC last one and stops, from the same checkpoint. Write to a table in both cases:
# MAGIC
# MAGIC ```python
# MAGIC orders_table = parse_orders(
# MAGIC     spark.readStream.format("jetstream").options(**NATS).option("stream", STREAM).option("group", GROUP).load()
# MAGIC )
# MAGIC (
# MAGIC     orders_table.writeStream.option("checkpointLocation", f"{WORK_DIR}/orders_table")
# MAGIC     .trigger(availableNow=True)  # serverless: on a schedule; classic: processingTime, or no trigger
# MAGIC     .toTable("orders")
# MAGIC )
# MAGIC ```
# MAGIC
# MAGIC On PySpark 4.0 and 4.1 an `availableNow` run is one batch (bounded by `maxMessagesPerTrigger` if set), and
# MAGIC the ack floors move to its end when the next run starts.

# COMMAND ----------

# MAGIC %md
# MAGIC Nothing is acked while Spark works on a batch. When Spark commits one, every member consumer's ack floor
# MAGIC moves to the batch's end, so the group's position in NATS equals the Spark checkpoint. The same table from a
# MAGIC shell: `spark-jetstream status --servers <url> --stream quickstart-orders --group spark-orders`.

# COMMAND ----------

checkpoint_seq = last.end_seq
members = admin.group_status(STREAM, GROUP)
print(f"{'member':<8}{'consumer':<18}{'partitions':<12}{'ack floor':>10}{'pending':>9}")
for m in members:
    print(f"{m.member:<8}{m.consumer:<18}{','.join(map(str, m.partitions)):<12}{m.ack_floor:>10}{m.pending:>9}")
floors_match = all(m.ack_floor == checkpoint_seq for m in members)
print(f"checkpoint seq {checkpoint_seq}; every ack floor equals it: {floors_match}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 5. Write back to JetStream
# MAGIC
# MAGIC A second group is a second, independent position in the same stream (like a Kafka consumer group). This
# MAGIC one has no stored config, so its members follow the stream's partitions. The query sends orders worth 400
# MAGIC or more to another stream.
# MAGIC
# MAGIC The streaming writer is exactly-once: every message gets a `Nats-Msg-Id` (the row's `msg_id`, else one made
# MAGIC from the query, batch, partition and row), and the server drops ids it has seen within the stream's
# MAGIC duplicate window. Batches the writer committed are also recorded in a KV bucket (`commitBucket`), so one
# MAGIC that Spark replays after a crash is skipped whole, even after the window. A batch cut short by a crash
# MAGIC relies on the window alone: make it longer than a restart takes, or write with `progressSubject` to a stream
# MAGIC with `allow_atomic` for exactly-once at any age (the repository's `examples/exactly_once` job does).

# COMMAND ----------

# The duplicate window (in nanoseconds) is how long the server remembers msg ids: an hour here.
admin.create_stream({"name": OUT_STREAM, "subjects": ["shop.large-orders.*"], "duplicate_window": 3600 * 10**9})


def large_orders(orders):
    """Orders worth 400 or more, as messages: subject, JSON data, and a msg_id derived from the order."""
    return orders.where(F.col("price") * F.col("quantity") >= 400).select(
        F.concat(F.lit("shop.large-orders."), "country").alias("subject"),
        F.to_json(F.struct("order_id", "customer", "price", "quantity")).alias("data"),
        F.concat(F.lit("large-"), F.col("order_id").cast("string")).alias("msg_id"),
    )


write_back = (
    large_orders(
        parse_orders(
            spark.readStream.format("jetstream")
            .options(**NATS)
            .option("stream", STREAM)
            .option("group", "large-orders")
            .load()
        )
    )
    .writeStream.format("jetstream")
    .options(**NATS)
    .option("checkpointLocation", f"{WORK_DIR}/large_orders")
    .trigger(availableNow=True)
    .start()
)
write_back.awaitTermination()

expected = sum(1 for o in orders if Decimal(f"{o['price']:.2f}") * o["quantity"] >= 400)
print(f"{OUT_STREAM} holds {admin.stream_info(OUT_STREAM)['state']['messages']} large orders (expected {expected})")

# COMMAND ----------

# MAGIC %md
# MAGIC Publishing the same orders again, here with a batch job over the snapshot from part 3, stores nothing
# MAGIC new: every `msg_id` is still within the stream's duplicate window.

# COMMAND ----------

large_orders(parse_orders(snapshot)).write.format("jetstream").options(**NATS).mode("append").save()
print(f"after publishing them again, {OUT_STREAM} holds {admin.stream_info(OUT_STREAM)['state']['messages']} messages")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 6. A KV bucket as a table, and its changes
# MAGIC
# MAGIC A KV bucket is a stream too (`KV_<bucket>`, one subject per key). `option("bucket", ...)` reads it as a table
# MAGIC (each live key's latest value; `keys` filters keys, `includeHistory` gives every revision) and, streaming, as a
# MAGIC feed of its changes. Rows: `key, value, revision, created, operation` (`PUT`, `DEL`, `PURGE`). Writing takes
# MAGIC `key` and `value` (null deletes the key), and an optional `revision` for compare-and-set.

# COMMAND ----------

BUCKET = "shop_prices"
admin.create_stream(  # what `nats kv add shop_prices` makes
    {"name": f"KV_{BUCKET}", "subjects": [f"$KV.{BUCKET}.>"], "max_msgs_per_subject": 1, "allow_rollup_hdrs": True,
     "deny_delete": True, "discard": "new", "allow_direct": True}
)  # fmt: skip
prices = spark.createDataFrame([("apple", "1.20"), ("pear", "0.90"), ("plum", "2.10")], "key string, value string")
prices.write.format("jetstream").options(**NATS).option("bucket", BUCKET).mode("append").save()
spark.read.format("jetstream").options(**NATS).option("bucket", BUCKET).load().show()

# COMMAND ----------

# MAGIC %md
# MAGIC Keep a parquet table equal to the bucket: `startingPosition=snapshot` gives the live values in the
# MAGIC first batch, then every change; each batch is merged by key (the latest revision wins; a delete removes
# MAGIC the key). On Databricks, `MERGE INTO` a Delta table does the same in place; here each batch writes a new
# MAGIC version of the table.

# COMMAND ----------

from pyspark.sql import Window

TABLE = f"{WORK_DIR}/prices_table"


def merge(changes, batch_id):
    """The table's next version: its rows without the changed keys, plus their latest values if still live."""
    latest = changes.withColumn("n", F.row_number().over(Window.partitionBy("key").orderBy(F.desc("revision"))))
    latest = latest.where("n = 1")
    session = changes.sparkSession  # the batch's own session: also where foreachBatch runs apart (Spark Connect)
    table = (  # batch ids go up one at a time, and batch N wrote version N: no listing needed here
        session.read.parquet(f"{TABLE}/v{batch_id - 1:06d}")
        if batch_id > 0
        else session.createDataFrame([], "key string, value binary, revision bigint")
    )
    merged = table.join(latest.select("key"), "key", "left_anti").unionByName(
        latest.where("operation = 'PUT'").select("key", "value", "revision")
    )
    merged.write.mode("overwrite").parquet(f"{TABLE}/v{batch_id:06d}")  # a replayed batch writes the same version


def sync():
    (
        spark.readStream.format("jetstream").options(**NATS).option("bucket", BUCKET)
        .option("startingPosition", "snapshot").load()
        .writeStream.foreachBatch(merge).option("checkpointLocation", f"{WORK_DIR}/prices_sync")
        .trigger(availableNow=True).start().awaitTermination()
    )  # fmt: skip


sync()
changes = spark.createDataFrame([("pear", None), ("kiwi", "0.50"), ("apple", "1.25")], "key string, value string")
changes.write.format("jetstream").options(**NATS).option("bucket", BUCKET).mode("append").save()
sync()
latest_version = list_dir(TABLE)[-1]
prices_table = spark.read.parquet(f"{TABLE}/{latest_version}").orderBy("key").collect()
print(f"prices table {latest_version}:", {row.key: bytes(row.value).decode() for row in prices_table})

# COMMAND ----------

# MAGIC %md
# MAGIC ## 7. Clean up
# MAGIC
# MAGIC Stops any query still running, deletes the group (its config and member consumers) and both streams, and
# MAGIC stops the embedded server if one was started. The KV buckets that hold group configs and the writer's
# MAGIC commit markers stay on the server.

# COMMAND ----------

for active in spark.streams.active:
    active.stop()
admin.delete_group(STREAM, GROUP)
admin.delete_stream(STREAM)  # also removes the consumers of the "large-orders" group
admin.delete_stream(OUT_STREAM)
admin.delete_stream(f"KV_{BUCKET}")
admin.close()
if embedded is not None:
    embedded.close()
    print("embedded nats-server stopped")
