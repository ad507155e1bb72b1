"""What a new user meets first: ``pip install '.[demo]' && spark-jetstream demo`` (issue 31)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spark_jetstream.tools import demo


def test_a_failed_warm_up_is_one_line_and_not_the_demos_failure(capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(source: type) -> None:
        raise RuntimeError("[PACKAGE_NOT_INSTALLED] Something >= 1 must be installed.\n  JVM stack trace ...")

    spark = SimpleNamespace(
        sparkContext=SimpleNamespace(defaultParallelism=2), dataSource=SimpleNamespace(register=refuse)
    )
    warm_up = demo.WorkerWarmUp(spark)  # type: ignore[arg-type]
    warm_up.start()
    warm_up.join(10)
    assert warm_up.failure == "[PACKAGE_NOT_INSTALLED] Something >= 1 must be installed."
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
