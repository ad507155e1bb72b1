"""A second, independent client that pulls from one of Spark's member consumers (plain nats-py,
not the connector's code), as a pcgroups standby would, or with the pin id it reads from consumer
info. Prints one JSON line: messages received, statuses seen, and when the first message came.

    python foreign_client.py --servers URL --stream S --consumer C --seconds 15 [--with-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import nats


async def main(args: argparse.Namespace) -> dict[str, object]:
    nc = await nats.connect(args.servers)
    received: list[float] = []
    statuses: dict[str, int] = {}

    async def on_message(msg: nats.aio.msg.Msg) -> None:
        status = (msg.headers or {}).get("Status")
        if status is None:
            received.append(time.time())
        else:
            statuses[status] = statuses.get(status, 0) + 1

    inbox = nc.new_inbox()
    await nc.subscribe(inbox, cb=on_message)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{args.stream}.{args.consumer}"
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not (args.with_pin and received):
        request: dict[str, object] = {"batch": 10, "group": "PCG", "expires": 1_000_000_000}
        if args.with_pin:
            info = json.loads((await nc.request(f"$JS.API.CONSUMER.INFO.{args.stream}.{args.consumer}", b"")).data)
            pin = next((g.get("pinned_client_id") for g in info.get("priority_groups") or []), None)
            if pin is None:
                await asyncio.sleep(0.2)
                continue
            request["id"] = pin
        await nc.publish(subject, json.dumps(request).encode(), reply=inbox)
        await asyncio.sleep(1.1)
    await nc.drain()
    return {"messages": len(received), "first_message_at": received[0] if received else None, "statuses": statuses}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--with-pin", action="store_true")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
