"""``fuzz``: the compiled bulk handlers under a coverage-guided differential fuzzer for a fixed time (issue 51, part 3),
``--fuzz-seconds`` per handler (deliveries, then Direct Get replies): ``bench/fuzz.py``, where how it builds and runs
is told. Needs atheris (``pip install atheris``; not a test requirement): without it the scenario says so and is
skipped. A difference between the two implementations, a crash or a sanitizer report fails the suite, naming the
folder that keeps the input."""

from __future__ import annotations

from common import heading
from suite import Suite


def run(suite: Suite) -> None:
    import fuzz

    seconds = suite.args.fuzz_seconds
    heading(f"fuzz: the compiled bulk handlers against their pure twins, {seconds:.0f} s per handler")
    try:
        import atheris  # noqa: F401
    except ImportError:
        print(f"  skipped: atheris is not installed ({fuzz.INSTALL}; it is not a test requirement)")
        suite.notes.append(f"fuzz skipped: atheris is not installed ({fuzz.INSTALL})")
        return
    results = fuzz.campaign(list(fuzz.KINDS), seconds)
    for result in results:
        suite.notes.append(
            f"fuzz {result.kind}: {result.runs:,} runs in {result.seconds:.0f} s ({result.execs_per_s:,} exec/s), "
            f"{result.edges:,} edges, {'a FINDING' if result.finding else 'clean'}"
        )
    found = [result.kind for result in results if result.finding]
    if found:
        raise SystemExit(f"FAILED: the fuzzer found inputs the {' and '.join(found)} handlers disagree or fail on")
