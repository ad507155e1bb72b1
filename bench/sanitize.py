"""The compiled bulk handlers under AddressSanitizer and UndefinedBehaviorSanitizer (issue 51, part 3).

Builds ``spark_jetstream/client/_speedups.c`` with ``-fsanitize=address,undefined -fno-sanitize-recover=undefined
-fno-omit-frame-pointer -O1 -g`` into a temporary directory beside a copy of the package (``bench/instrumented.py``:
the in-place build is left as it is), then runs on it, with the sanitizers' runtimes preloaded, ``PYTHONMALLOC=malloc``
(every Python object a block ASan watches) and leak checks off:

* ``tests/test_speedups.py``, the differential test (its harness hands the compiled handlers buffers that end at a
  page no read may touch, so a read one byte past the end faults where a bytearray's trailing NUL would hide it);
* the compiled half of the tests that parse (the ``bulk_parsers`` fixture) in ``test_protocol.py``, ``test_pull.py``
  and ``test_direct_replies.py``; none of them needs a server or Spark.

It fails (exit status 1, the reports printed) when a test fails, the process dies, or a sanitizer reported anything.
Run it from the repository root::

    python bench/sanitize.py                      # gcc, whose ASan and UBSan runtimes Debian's gcc brings
    python bench/sanitize.py --compiler clang-14  # or clang's (libclang-rt-14-dev)
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from instrumented import ASAN_OPTIONS, ROOT, SANITIZE, UBSAN_OPTIONS, BuildError, build, check_loaded, env, gcc_runtimes

TESTS = ["tests/test_speedups.py", "tests/test_protocol.py", "tests/test_pull.py", "tests/test_direct_replies.py"]
SELECTED = "test_speedups or compiled"
"""All of test_speedups.py, and the compiled half of the others' bulk_parsers tests."""
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "SUMMARY: AddressSanitizer", "SUMMARY: UndefinedBehavior")


def runtimes(compiler: str) -> list[str]:
    """The sanitizer runtimes to preload for an extension ``compiler`` built."""
    if "clang" not in compiler:
        return gcc_runtimes(compiler)
    asan = subprocess.run(
        [compiler, f"-print-file-name=libclang_rt.asan-{platform.machine()}.so"], capture_output=True, text=True
    ).stdout.strip()
    if not Path(asan).is_file():
        raise BuildError(f"{compiler} has no shared ASan runtime (Debian: libclang-rt-NN-dev)")
    return [asan]  # clang's ASan runtime carries UBSan's handlers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--compiler", default="gcc", help="the C compiler to build with (gcc)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary build and the sanitizers' logs")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sanitize-"))
    began = time.monotonic()
    try:
        try:
            src = build(work, args.compiler, SANITIZE)
            logs = work / "reports"
            logs.mkdir()
            environment = env(
                src,
                runtimes(args.compiler),
                ASAN_OPTIONS=f"{ASAN_OPTIONS}:log_path={logs}/asan",
                UBSAN_OPTIONS=f"{UBSAN_OPTIONS}:log_path={logs}/ubsan",
            )
            path = check_loaded(src, environment)
        except BuildError as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
        print(f"sanitized build: {args.compiler} {' '.join(SANITIZE)} -> {path}", flush=True)
        command = [sys.executable, "-P", "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:faulthandler"]
        command += ["-m", "not slow", "-k", SELECTED, *TESTS, *args.pytest_args]
        done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, check=False)
        output = done.stdout + done.stderr
        print("\n".join(output.splitlines()[-12:]))  # -v: a test that crashed the process is the last one named
        reports = sorted(logs.iterdir())
        for report in reports:
            print(f"-- {report.name}\n{report.read_text(errors='replace')}", file=sys.stderr)
        spoke = [marker for marker in REPORTS if marker in output]
        seconds = time.monotonic() - began
        if done.returncode != 0 or reports or spoke:
            print(
                f"FAILED: pytest exited {done.returncode}, {len(reports)} sanitizer report(s)"
                f"{', output names ' + ', '.join(spoke) if spoke else ''} ({seconds:.0f} s)",
                file=sys.stderr,
            )
            return 1
        print(f"sanitizers clean: no ASan or UBSan report, every selected test passed ({seconds:.0f} s)")
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
