"""A Spark standalone cluster on one machine: a Master on 127.0.0.1 and Workers bound to other loopback addresses, so
that Spark sees several hosts (speculative copies run on another host; a lost node is a host of its own). The
speculation test and the chaos benchmark run on it.

A lost Spark node is more than the Worker's process group: executors are the Worker's children, and PySpark's
``daemon.py`` moves itself and the Python workers it forks into a group of their own (``setpgid``), so
``kill_tree`` stops every process of the tree, then kills them all.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from spark_jetstream.testing.server import free_port

HOSTS = ("127.0.0.2", "127.0.0.3")
"""The Workers' loopback addresses: one Spark host each."""


def spark_home() -> str:
    """``$SPARK_HOME``, else the installed PySpark's folder (pip's ``pyspark`` carries ``bin/spark-class``)."""
    if home := os.environ.get("SPARK_HOME"):
        return home
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("PySpark is not installed and SPARK_HOME is not set: no Spark to run a cluster of")
    return str(Path(spec.origin).parent)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, whatever its process group or session."""
    by_parent: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            by_parent.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started with its own session, its group and every descendant. The tree is stopped first
    (SIGSTOP, again until no new process shows up), so nothing forks a child that would outlive the kill; then every
    process is killed at once."""
    stopped: set[int] = set()
    while process.poll() is None:
        found = {process.pid, *descendants(process.pid)} - stopped
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGSTOP)
        stopped |= found
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


class StandaloneCluster:
    """A Spark standalone Master on 127.0.0.1 and one Worker per host of ``hosts``, each offering ``cores`` cores and
    ``memory``; ``env`` is added to their environment (executors inherit it). Logs go to ``<workdir>/<name>.log``."""

    def __init__(
        self,
        workdir: Path,
        hosts: Sequence[str] = HOSTS,
        cores: int = 1,
        memory: str = "1g",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.home = spark_home()
        self.workdir = workdir
        self.hosts = tuple(hosts)
        self.cores = cores
        self.memory = memory
        self.env = dict(env or {})
        self.port = free_port()
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * len(self.hosts)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, host: str, *args: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            **self.env,
            "SPARK_HOME": self.home,
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_MEMORY": "256m",
        }
        with open(self.workdir / f"{name}.log", "ab") as log:
            command = [os.path.join(self.home, "bin", "spark-class"), *args]
            return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> StandaloneCluster:
        master = "org.apache.spark.deploy.master.Master"
        ports = ("--port", str(self.port), "--webui-port", str(free_port()))
        self.master = self._spawn("master", "127.0.0.1", master, "--host", "127.0.0.1", *ports)
        for index in range(len(self.hosts)):
            self.start_worker(index)
        return self

    def start_worker(self, index: int) -> None:
        """Start the Worker of host ``index`` (again, after ``lose_worker``: a new Worker on the same host)."""
        host, work = self.hosts[index], self.workdir / f"worker{index}"
        work.mkdir(parents=True, exist_ok=True)
        offer = ("--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()))
        worker = "org.apache.spark.deploy.worker.Worker"
        self.workers[index] = self._spawn(
            f"worker{index}", host, worker, "--host", host, *offer, "--work-dir", str(work), self.url
        )

    def lose_worker(self, index: int) -> None:
        """The node of host ``index`` is gone: its Worker, executors and Python workers killed at once."""
        worker, self.workers[index] = self.workers[index], None
        if worker is not None:
            kill_tree(worker)

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        for index in range(len(self.hosts)):
            self.lose_worker(index)
        if self.master is not None:
            kill_tree(self.master)
