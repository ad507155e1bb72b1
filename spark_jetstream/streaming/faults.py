"""Crash points for tests: ``SPARK_JETSTREAM_FAULT=<point>:<file>`` makes the driver stop exactly there."""

from __future__ import annotations

import os
import time


def fault_point(name: str) -> None:
    """Crash-test hook: with ``SPARK_JETSTREAM_FAULT=<name>:<file>`` the driver announces that it
    reached ``<name>`` by creating ``<file>`` and then hangs, so a test can SIGKILL it exactly
    there. Fires once per marker file; without the variable it costs one dict lookup."""
    point, _, marker = os.environ.get("SPARK_JETSTREAM_FAULT", "").partition(":")
    if point == name and marker and not os.path.exists(marker):
        with open(marker, "w"):
            pass
        time.sleep(600)
