"""The compiled bulk handlers built with sanitizers into a copy of the package, for ``bench/sanitize.py`` and
``bench/fuzz.py`` (issue 51, part 3). The in-place build the tests and benchmarks use is never touched.

``setup.py build_ext`` compiles ``_speedups.c`` with the flags given into a build folder of a temporary directory,
and the package's Python sources are copied beside it, so a process started with ``PYTHONPATH`` at the copy (and
``python -P``: no current directory first on ``sys.path``) imports the instrumented extension instead of the one in
the source tree. ``env`` gives what such a process needs: the sanitizer runtime preloaded (Python itself is not
instrumented), ``PYTHONMALLOC=malloc`` so that every Python object is a block the sanitizer watches, and leak checks
off (CPython keeps what it allocated at start-up).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "spark_jetstream"
EXTENSION = "spark_jetstream/client/_speedups"

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
"""ASan and UBSan, every UBSan report fatal. Python's own flags come first (``-O3``, ``-fwrapv``): the later ``-O1``
wins, and ``-fno-wrapv`` (added by ``build``) turns signed overflow back into something UBSan reports."""

ASAN_OPTIONS = "detect_leaks=0:abort_on_error=1:handle_segv=1:handle_abort=1:allocator_may_return_null=1"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"


class BuildError(RuntimeError):
    pass


def find_clang() -> str | None:
    """A clang on ``PATH`` (``clang``, else the newest ``clang-NN``), or None."""
    if shutil.which("clang"):
        return "clang"
    for version in range(25, 10, -1):
        if shutil.which(f"clang-{version}"):
            return f"clang-{version}"
    return None


def build(work: Path, compiler: str, flags: list[str]) -> Path:
    """Build the extension with ``compiler`` and ``flags`` under ``work`` next to a copy of the package's sources;
    the folder to put on ``PYTHONPATH``."""
    lib, objects, src = work / "lib", work / "obj", work / "src"
    env = {
        **os.environ,
        "CC": compiler,
        "CFLAGS": " ".join([*flags, "-fno-wrapv"]),
        "LDSHARED": f"{compiler} -shared",
        "LDFLAGS": " ".join(flag for flag in flags if flag.startswith("-fsanitize")),
    }
    command = [sys.executable, "setup.py", "-q", "build_ext", "--force", "--build-lib", str(lib)]
    done = subprocess.run(
        [*command, "--build-temp", str(objects)], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    built = sorted(lib.glob(f"{EXTENSION}*.so"))
    if done.returncode != 0 or not built:  # the extension is optional: a failed build may still exit 0
        output = done.stdout + done.stderr
        raise BuildError(f"building {EXTENSION}.c with {compiler} {' '.join(flags)} failed:\n{output}")
    shutil.copytree(ROOT / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "*.c"))
    shutil.copy2(built[0], src / PACKAGE / "client" / built[0].name)
    return src


def env(src: Path, preload: list[str], **extra: str) -> dict[str, str]:
    """The environment of a process that imports the copy at ``src`` with the runtimes ``preload`` loaded first."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONMALLOC": "malloc",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LD_PRELOAD": " ".join(preload),
        "ASAN_OPTIONS": ASAN_OPTIONS,
        "UBSAN_OPTIONS": UBSAN_OPTIONS,
        **extra,
    }


def gcc_runtimes(compiler: str = "gcc") -> list[str]:
    """The paths of gcc's ASan and UBSan runtimes (what ``-fsanitize=address,undefined`` links)."""
    found = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(path) or not os.path.exists(path):
            raise BuildError(f"{compiler} has no {name}: install its sanitizer runtimes (Debian: libgcc-12-dev)")
        found.append(os.path.realpath(path))
    return found


CHECK = """
import ctypes, sys
from spark_jetstream.client import _speedups, protocol
assert ctypes.CDLL(None).__asan_init, "no ASan runtime in the process"
compiled, why = protocol.compiled_parsers()
assert compiled is not None, why
print(_speedups.__file__)
"""


def check_loaded(src: Path, environment: dict[str, str]) -> str:
    """Make sure a process with ``environment`` imports the instrumented extension at ``src``, with ASan loaded and
    the extension's accesses instrumented; the extension's path."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", CHECK], env=environment, cwd=src, capture_output=True, text=True, check=False
    )
    path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not path.startswith(str(src)):
        raise BuildError(f"the instrumented extension did not load from {src}:\n{done.stdout}{done.stderr}")
    symbols = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True).stdout
    if "__asan_report_load" not in symbols:
        raise BuildError(f"{path} has no ASan checks on its loads")
    return path
