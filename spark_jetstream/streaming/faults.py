"""Crash points for tests: ``SPARK_JETSTREAM_FAULT=<point>[#n]:<file>`` makes the driver stop exactly there."""

from __future__ import annotations

import os
import time
from collections import Counter

_reached: Counter[str] = Counter()


def fault_point(name: str) -> None:
    """Crash-test hook: with ``SPARK_JETSTREAM_FAULT=<name>:<file>`` the driver announces that it reached ``<name>``
    by creating ``<file>`` and then hangs, so a test can SIGKILL it exactly there; ``<name>#<n>`` waits for the
    ``n``-th time this process reaches it (a later batch). Fires once per marker file; without the variable it costs
    one dict lookup."""
    spec, _, marker = os.environ.get("SPARK_JETSTREAM_FAULT", "").partition(":")
    point, _, nth = spec.partition("#")
    if point != name or not marker:
        return
    _reached[name] += 1
    if _reached[name] >= int(nth or 1) and not os.path.exists(marker):
        with open(marker, "w"):
            pass
        time.sleep(600)
