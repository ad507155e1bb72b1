"""A naive JetStream source, as a user would first write it with nats-py's fetch().

A baseline for benchmarks: what a user would write instead of spark-jetstream. One Spark
partition; offsets are the stream's last sequence; read() binds an ephemeral pull consumer
starting at start+1 and fetch()es until it reaches end.
No groups, no pinning, no acks: not a competitor on semantics, only on speed.

The baseline the benchmark brief gave (it lived outside the repository); kept as given, only
formatted, so the suite's read ratios stay comparable with earlier runs.
"""

from __future__ import annotations

import asyncio

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

SCHEMA = "subject string, data binary, stream string, seq long, timestamp timestamp"


class _Range(InputPartition):
    def __init__(self, start: int, end: int):
        self.start, self.end = start, end


class NaiveReader(DataSourceStreamReader):
    def __init__(self, options):
        self.url = options["servers"]
        self.stream = options["stream"]

    def _last_seq(self) -> int:
        import nats

        async def go():
            nc = await nats.connect(self.url)
            info = await nc.jetstream().stream_info(self.stream)
            await nc.close()
            return info.state.last_seq

        return asyncio.run(go())

    def initialOffset(self):
        return {"seq": 0}

    def latestOffset(self, start=None, limit=None):
        return {"seq": self._last_seq()}

    def partitions(self, start, end):
        if end["seq"] <= start["seq"]:
            return []
        return [_Range(start["seq"], end["seq"])]

    def read(self, partition):
        import datetime

        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        async def go():
            nc = await nats.connect(self.url)
            js = nc.jetstream()
            sub = await js.pull_subscribe(
                "",
                stream=self.stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=partition.start + 1,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=30.0,
                ),
            )
            rows = []
            done = False
            while not done:
                for m in await sub.fetch(500, timeout=5):
                    md = m.metadata
                    if md.sequence.stream > partition.end:
                        done = True
                        break
                    rows.append(
                        (m.subject, m.data, self.stream, md.sequence.stream, md.timestamp.replace(tzinfo=datetime.UTC))
                    )
                    if md.sequence.stream >= partition.end or md.num_pending == 0:
                        done = True
                        break
            await nc.close()
            return rows

        yield from asyncio.run(go())


class NaiveSource(DataSource):
    @classmethod
    def name(cls):
        return "naive-jetstream"

    def schema(self):
        return SCHEMA

    def streamReader(self, schema):
        return NaiveReader(self.options)


def register(spark) -> None:
    spark.dataSource.register(NaiveSource)
