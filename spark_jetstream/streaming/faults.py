"""Crash points for tests: ``SPARK_JETSTREAM_FAULT=<point>[#n]:<file>`` makes the driver stop exactly there."""

from __future__ import annotations

import os
import time
from collections import Counter

_reached: Counter[str] = Counter()


def fault_point(name: str) -> None:
    """Crash-test hook: with ``SPARK_JETSTREAM_FAULT=<name>:<file>`` the driver announces that it reached ``<name>``
    by creating ``<file>`` and then hangs, so a test can SIGKILL it exactly there, or do something and remove the file
    to let it go on (a pause); ``<name>#<n>`` waits for the ``n``-th time this process reaches it (a later batch).
    Fires once per process; without the variable it costs one dict lookup."""
    spec, _, marker = os.environ.get("SPARK_JETSTREAM_FAULT", "").partition(":")
    point, _, nth = spec.partition("#")
    if point != name or not marker:
        return
    _reached[name] += 1
    if _reached[name] != int(nth or 1) or os.path.exists(marker):
        return
    with open(marker, "w"):
        pass
    deadline = time.monotonic() + 600
    while os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
