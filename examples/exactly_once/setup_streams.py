"""Create the example's streams and publish sample orders, with nats-py (installed with spark-jetstream).

python setup_streams.py create  [--servers nats://localhost:4222]
    creates the streams of source.json (ORDERS) and target.json (INVOICES), as `nats stream add --config` does
python setup_streams.py publish --count 1000 [--first 1] [--servers ...]
    publishes orders FIRST .. FIRST+COUNT-1 to orders.<customer>, each with a Nats-Msg-Id
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import nats

HERE = Path(__file__).resolve().parent
COUNTRIES = ("DE", "FR", "NL", "PL", "US")


def order(order_id: int) -> dict[str, object]:
    """Sample order ``order_id``: always the same one for the same id."""
    return {
        "order_id": order_id,
        "customer": f"c{order_id % 17:02d}",
        "country": COUNTRIES[order_id % len(COUNTRIES)],
        "quantity": 1 + order_id % 4,
        "price": round(1 + (order_id * 37) % 9900 / 100, 2),
    }


async def create(servers: str) -> None:
    nc = await nats.connect(servers)
    try:
        for file in ("source.json", "target.json"):
            config = json.loads((HERE / file).read_text())
            reply = await nc.request(f"$JS.API.STREAM.CREATE.{config['name']}", json.dumps(config).encode(), timeout=10)
            answer = json.loads(reply.data)
            if "error" in answer:
                sys.exit(f"stream {config['name']}: {answer['error'].get('description')}")
            print(f"stream {config['name']}: subjects {', '.join(answer['config']['subjects'])}")
    finally:
        await nc.close()


async def publish(servers: str, first: int, count: int) -> None:
    nc = await nats.connect(servers)
    try:
        js = nc.jetstream()
        for order_id in range(first, first + count):
            body = order(order_id)
            headers = {"Nats-Msg-Id": f"order-{order_id}"}  # published again: stored once (duplicate window)
            await js.publish(f"orders.{body['customer']}", json.dumps(body).encode(), headers=headers)
        print(f"published orders {first} to {first + count - 1}")
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("create", "publish"))
    parser.add_argument("--servers", default=os.environ.get("NATS_URL", "nats://localhost:4222"))
    parser.add_argument("--first", type=int, default=1, help="the first order id to publish")
    parser.add_argument("--count", type=int, default=1000, help="how many orders to publish")
    args = parser.parse_args()
    if args.command == "create":
        asyncio.run(create(args.servers))
    else:
        asyncio.run(publish(args.servers, args.first, args.count))


if __name__ == "__main__":
    main()
