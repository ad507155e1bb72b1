"""A coverage-guided differential fuzzer over the compiled bulk handlers, for a fixed time (issue 51, part 3).

atheris (libFuzzer for Python) makes inputs from the seeds in ``bench/fuzz_corpus/<kind>/`` (``run-*``: runs of
deliveries and of Direct Get replies from the differential test's generators; ``hostile-*``: its hostile cases;
``found-*``: inputs earlier runs found that reach code the others do not) and the tokens of
``bench/fuzz_corpus/nats.dict``. Each input goes to the compiled handler and to its pure-Python twin, as a buffer
from position 0, for subscriptions 5 and 55 (the seeds' messages are to both) with and without header blocks kept:
the rows appended, the callback's arguments (types and contents), the position returned and the error raised must be
equal (``tests/test_speedups.py``'s ``outcome``). The compiled handler gets the bytes twice: ending where an
unreadable page begins (a read one byte past the end faults), and in a bytearray (ASan's red zones around it). Any
difference, crash or sanitizer report stops the run, and libFuzzer writes the input to the findings folder it
prints; the run's new inputs go to a temporary folder, never into the seeds.

Where clang is (``apt-get install clang libclang-rt-dev``, or ``clang-14 libclang-rt-14-dev``), the extension is
built with ``-fsanitize=address,undefined,fuzzer-no-link`` into a temporary copy of the package (the in-place build
is left as it is) and runs with atheris' ``asan_with_fuzzer.so`` preloaded, as atheris documents for native
extensions: coverage of the C code guides the fuzzer, and ASan and UBSan watch it. Without clang, the in-place build
runs without sanitizers, and only the pure handler's Python code is coverage (the output says so).

atheris is the fuzzer's alone, not a test requirement::

    pip install atheris
    python bench/fuzz.py --seconds 150                 # each handler for 150 s
    python bench/fuzz.py --kind direct --seconds 30 -- -use_value_profile=1   # more libFuzzer flags after --
    python bench/fuzz.py --write-seeds                 # rewrite the seeds from the tests' generators
    python bench/run.py --only fuzz --fuzz-seconds 60  # as a scenario of the suite
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from instrumented import ROOT, SANITIZE, BuildError, build, check_loaded, env, find_clang

CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
DICTIONARY = CORPUS / "nats.dict"
KINDS = ("deliveries", "direct")
SIDS = (5, 55)
MAX_LEN = 8192
"""Inputs up to 8 KiB: room for a number longer than ``int()`` converts (4,300 digits; seeds have some)."""
FLAGS = ["-timeout=30", "-rss_limit_mb=6144", f"-max_len={MAX_LEN}", "-print_final_stats=1", "-print_pcs=0"]
INSTALL = "pip install atheris"


@dataclass
class Result:
    """One handler's run: what libFuzzer said at its end."""

    kind: str
    seconds: float
    runs: int = 0
    execs_per_s: int = 0
    edges: int = 0
    features: int = 0
    corpus: int = 0
    new_units: int = 0
    peak_rss_mb: int = 0
    finding: str = ""
    """Empty when clean; else what stopped the run and where its input is."""


@dataclass
class Setting:
    """How the handlers are built and run: the environment of the fuzzing processes, and what it has."""

    environment: dict[str, str]
    what: str


# -- the fuzzing process ------------------------------------------------------------------------------------------


def fuzz_one_kind(kind: str, libfuzzer_args: list[str]) -> None:
    """Run atheris over ``kind``'s handlers (never returns: libFuzzer exits the process)."""
    import atheris

    with atheris.instrument_imports(include=["spark_jetstream.client.protocol"]):  # the pure handlers' branches
        from spark_jetstream.client import protocol
    sys.path.insert(0, str(ROOT / "tests"))
    import test_speedups as differential

    compiled, why = protocol.compiled_parsers()
    if compiled is None:
        raise SystemExit(f"no compiled bulk handlers to fuzz: {why}")
    from spark_jetstream.client import _speedups

    print(f"fuzzing {kind}: {_speedups.__file__}", flush=True)

    def one_input(data: bytes) -> None:
        for sid in SIDS:
            for keep_headers in (False, True):
                pure = differential.outcome(protocol.PURE, kind, data, 0, keep_headers, sid)
                for guard in (True, False):  # guarded memory (a read past the end), a bytearray (ASan's red zones)
                    other = differential.outcome(compiled, kind, data, 0, keep_headers, sid, guard)
                    if other != pure:
                        raise AssertionError(
                            f"the {kind} handlers differ (sid {sid}, keep_headers={keep_headers}, guard={guard}):\n"
                            f"  pure     {differential._short(pure)}\n  compiled {differential._short(other)}"
                        )

    itself = f"{sys.executable} {Path(__file__).resolve()} --child {kind} --"  # how libFuzzer's -merge=1 starts it
    atheris.Setup([itself, *libfuzzer_args], one_input)
    atheris.Fuzz()


# -- seeds ----------------------------------------------------------------------------------------------------------


def seeds() -> dict[str, dict[str, bytes]]:
    """The seed inputs by kind, by file name: generated runs (2-8 messages each, fixed seeds) and the differential
    test's hostile cases that fit in ``MAX_LEN``."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_speedups as differential

    found: dict[str, dict[str, bytes]] = {}
    for kind, hostile in (("deliveries", differential.HOSTILE_DELIVERIES), ("direct", differential.HOSTILE_REPLIES)):
        files = {}
        for seed in range(24):
            rng = random.Random(1000 + seed)
            files[f"run-{seed:02d}"] = b"".join(differential.GENERATORS[kind](rng, rng.randrange(2, 9)))
        for number, data in enumerate(hostile):
            if 0 < len(data) <= MAX_LEN:
                files[f"hostile-{number:02d}"] = data
        found[kind] = files
    return found


def write_seeds() -> None:
    """Write the seeds (``run-*``, ``hostile-*``), leaving the inputs that fuzzing found (``found-*``)."""
    for kind, files in seeds().items():
        folder = CORPUS / kind
        folder.mkdir(parents=True, exist_ok=True)
        for old in [*folder.glob("run-*"), *folder.glob("hostile-*")]:
            old.unlink()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        print(f"{folder.relative_to(ROOT)}: {len(files)} seeds, {sum(map(len, files.values())):,} bytes")


# -- the campaign ---------------------------------------------------------------------------------------------------


def prepare(work: Path, plain: bool = False) -> Setting:
    """Build the extension for fuzzing under ``work``: with clang, instrumented for coverage and sanitizers."""
    import atheris

    clang = None if plain else find_clang()
    preload = Path(atheris.path()) / "asan_with_fuzzer.so"
    if clang is None or not preload.is_file():
        why = "--plain" if plain else ("no clang here" if clang is None else f"atheris has no {preload.name}")
        return Setting(
            {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            f"the in-place build, no sanitizers, coverage of the pure handler's Python only ({why})",
        )
    flags = [SANITIZE[0] + ",fuzzer-no-link", *SANITIZE[1:]]
    src = build(work, clang, flags)
    environment = env(src, [str(preload)])
    check_loaded(src, environment)
    return Setting(environment, f"{clang} {' '.join(flags)}, {preload.name} preloaded, PYTHONMALLOC=malloc")


def parse(kind: str, seconds: float, output: str) -> Result:
    result = Result(kind, seconds)
    done = re.findall(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+ .*?exec/s: (\d+) rss: (\d+)Mb", output)
    pulses = re.findall(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+ .*?exec/s: (\d+) rss: (\d+)Mb", output)
    last = done[-1] if done else (pulses[-1] if pulses else None)
    if last:
        runs, edges, features, corpus, rate, rss = map(int, last)
        result.runs, result.edges, result.features, result.corpus = runs, edges, features, corpus
        result.execs_per_s, result.peak_rss_mb = rate, rss
    for name, attribute in (
        ("number_of_executed_units", "runs"),
        ("average_exec_per_sec", "execs_per_s"),
        ("new_units_added", "new_units"),
        ("peak_rss_mb", "peak_rss_mb"),
    ):
        if found := re.search(rf"stat::{name}:\s+(\d+)", output):
            setattr(result, attribute, int(found.group(1)))
    return result


def run_kind(kind: str, seconds: float, setting: Setting, work: Path, extra: list[str]) -> Result:
    """Fuzz one handler for ``seconds``; new inputs go to a folder of ``work``, the seeds are only read."""
    findings = work / "findings" / kind
    grown = work / "corpus" / kind
    findings.mkdir(parents=True)
    grown.mkdir(parents=True)
    args = [*FLAGS, f"-max_total_time={int(seconds)}", f"-dict={DICTIONARY}", f"-artifact_prefix={findings}/"]
    command = [sys.executable, __file__, "--child", kind, "--", *args, *extra, str(grown), str(CORPUS / kind)]
    log = work / f"{kind}.log"
    began = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=work, env=setting.environment, stdout=out, stderr=subprocess.STDOUT)
    output = log.read_text(errors="replace")
    result = parse(kind, time.monotonic() - began, output)
    artifacts = sorted(findings.iterdir())
    if done.returncode != 0 or artifacts:
        tail = "\n".join(output.splitlines()[-60:])
        result.finding = f"exit status {done.returncode}, inputs {[str(a) for a in artifacts]}\n{tail}"
    return result


def campaign(
    kinds: list[str], seconds: float, plain: bool = False, extra: list[str] | None = None, keep: bool = False
) -> list[Result]:
    """Fuzz each handler in turn for ``seconds``; prints what it did and returns the results. A temporary folder holds
    the build, the logs and the corpus the run grew, and is kept (and named) when something was found or ``keep``."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        raise SystemExit(f"atheris is not installed: {INSTALL} (it is not a test requirement)") from None
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    results: list[Result] = []
    try:
        setting = prepare(work, plain)
        print(f"  fuzzing the compiled bulk handlers: {setting.what}", flush=True)
        for kind in kinds:
            results.append(run_kind(kind, seconds, setting, work, extra or []))
            report(results[-1:])
    except BuildError as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    finally:
        if keep or any(result.finding for result in results):
            print(f"  the findings, logs and grown corpus are kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return results


def report(results: list[Result]) -> None:
    for r in results:
        print(
            f"  {r.kind:<11} {r.seconds:>6.0f} s {r.runs:>10,} runs {r.execs_per_s:>7,} exec/s  cov {r.edges:,} "
            f"ft {r.features:,} corpus {r.corpus:,} (+{r.new_units:,} new)  peak RSS {r.peak_rss_mb:,} MB  "
            f"{'FINDING' if r.finding else 'clean'}",
            flush=True,
        )
        if r.finding:
            print(r.finding)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--kind", default=",".join(KINDS), help=f"comma-separated handlers: {', '.join(KINDS)}")
    parser.add_argument("--seconds", type=float, default=60.0, help="fuzzing time per handler (60)")
    parser.add_argument("--plain", action="store_true", help="the in-place build, without clang's instrumentation")
    parser.add_argument("--keep", action="store_true", help="keep the build, the logs and the grown corpus")
    parser.add_argument("--write-seeds", action="store_true", help="rewrite bench/fuzz_corpus/ from the generators")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        fuzz_one_kind(args.child, extra)
        return 0
    if args.write_seeds:
        write_seeds()
        return 0
    kinds = [kind.strip() for kind in args.kind.split(",") if kind.strip()]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kind takes {', '.join(KINDS)}")
    results = campaign(kinds, args.seconds, args.plain, extra, args.keep)
    return 1 if any(result.finding for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
