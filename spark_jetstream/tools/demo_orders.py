"""The demo's data and its pipeline: the order events it publishes (with the totals to check the output
against), the publisher that paces them, and the per-batch revenue by region it writes to parquet."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.publish import Message, publish_all

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

REGIONS = ("emea", "amer", "apac", "latam")
ORDER_SCHEMA = "order_id LONG, customer STRING, region STRING, sku STRING, quantity INT, price_cents LONG, ts STRING"


@dataclass
class Totals:
    """What the publisher sent, per region: the oracle the parquet output is checked against."""

    orders: Counter[str] = field(default_factory=Counter)
    revenue_cents: Counter[str] = field(default_factory=Counter)

    def add(self, region: str, quantity: int, price_cents: int) -> None:
        self.orders[region] += 1
        self.revenue_cents[region] += quantity * price_cents


def orders(count: int, totals: Totals, seed: int = 1) -> Iterator[Message]:
    """Order events: JSON payloads on ``orders.<customer>`` with a content type and a trace id."""
    rng = random.Random(seed)
    for index in range(count):
        customer = f"c{rng.randrange(5000):04d}"
        region = REGIONS[int(customer[1:]) % len(REGIONS)]
        quantity, price_cents = rng.randrange(1, 5), rng.randrange(100, 20_000)
        totals.add(region, quantity, price_cents)
        order = {
            "order_id": index,
            "customer": customer,
            "region": region,
            "sku": f"sku-{rng.randrange(300)}",
            "quantity": quantity,
            "price_cents": price_cents,
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        headers = {"content-type": "application/json", "trace-id": f"{rng.getrandbits(64):016x}"}
        yield f"orders.{customer}", json.dumps(order).encode(), headers


class PacedPublisher(threading.Thread):
    """Publishes the orders in chunks at about ``rate`` messages per second (0: as fast as it can)."""

    def __init__(self, conn: Connection, count: int, rate: int) -> None:
        super().__init__(name="demo-publisher", daemon=True)
        self.conn, self.count, self.rate = conn, count, rate
        self.totals = Totals()
        self.published = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            began, chunk = time.monotonic(), max(500, self.rate // 10)
            batch: list[Message] = []
            for message in orders(self.count, self.totals):
                batch.append(message)
                if len(batch) == chunk:
                    self._send(batch, began)
                    batch = []
            if batch:
                self._send(batch, began)
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _send(self, batch: list[Message], began: float) -> None:
        self.published += publish_all(self.conn, batch).count
        if self.rate:
            ahead = self.published / self.rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)


def parse_orders(messages: DataFrame) -> DataFrame:
    """The orders' JSON payloads as columns."""
    from pyspark.sql import functions as F

    return messages.select(F.from_json(F.col("data").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*")


def write_revenue(orders: DataFrame, path: Path) -> None:
    """Orders and revenue by region of one batch, into parquet at ``path`` (replaced if there)."""
    from pyspark.sql import functions as F

    revenue = F.sum(F.col("quantity") * F.col("price_cents"))
    orders.groupBy("region").agg(F.count("*").alias("orders"), revenue.alias("revenue")).write.mode(
        "overwrite"
    ).parquet(str(path))
