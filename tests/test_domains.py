"""Another JetStream domain: a hub and a leaf node with domain ``leaf``, a bucket of the same name in each. Writes
with ``domain=leaf`` reach the leaf's bucket only: KV rows, the streaming sink's commit markers and group configs
(``$JS.leaf.API.$KV...``, which the leaf maps to its ``$KV.>``, as nats.go writes). Real nats-servers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from helpers import wait_for

from spark_jetstream.client.connection import Connection, ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.kv import get_entry, key_value
from spark_jetstream.groups.admin import change_members, create_group, delete_group, load_group
from spark_jetstream.groups.layout import GroupConfig, PartitioningFilter
from spark_jetstream.sink.markers import ensure_bucket, read_marker, write_marker
from spark_jetstream.testing import EmbeddedServer, free_port

pytestmark = pytest.mark.slow


class HubAndLeaf:
    def __init__(self) -> None:
        port = free_port()
        self.hub = EmbeddedServer({"leafnodes": {"port": port}, "jetstream": {"domain": "hub"}}, name="hub").start()
        self.leaf = EmbeddedServer(
            {"leafnodes": {"remotes": [{"url": f"nats-leaf://127.0.0.1:{port}"}]}, "jetstream": {"domain": "leaf"}},
            name="leaf",
        ).start()
        self.options = {
            "hub": ConnectionOptions(servers=(self.hub.url,)),
            "leaf": ConnectionOptions(servers=(self.hub.url,), domain="leaf"),
        }

    def api(self, domain: str) -> JetStreamApi:
        return JetStreamApi(self.conn(domain))

    def conn(self, domain: str) -> Connection:
        return connect(self.options[domain])

    def close(self) -> None:
        for options in self.options.values():
            disconnect(options)
        self.leaf.close()
        self.hub.close()


@pytest.fixture(scope="module")
def domains() -> Iterator[HubAndLeaf]:
    made = HubAndLeaf()
    try:
        wait_for(lambda: _answers(made.api("leaf")), 30, "the leaf's JetStream to answer through the hub")
        for domain in ("hub", "leaf"):
            made.api(domain).conn.run(key_value(made.api(domain), "cfg", create=True))
        yield made
    finally:
        made.close()


def _answers(api: JetStreamApi) -> bool:
    try:
        api.stream_names()
        return True
    except Exception:
        return False


def _keys(api: JetStreamApi, bucket: str) -> int:
    return api.stream_info(f"KV_{bucket}")["state"].get("num_subjects", 0) if _answers(api) else -1


def test_a_kv_write_with_a_domain_goes_to_that_domains_bucket(spark, domains: HubAndLeaf):
    frame = spark.createDataFrame([(f"k{i}", f"v{i}".encode()) for i in range(200)], "key string, value binary")
    frame.write.format("jetstream").option("servers", domains.hub.url).option("domain", "leaf").option(
        "bucket", "cfg"
    ).mode("append").save()
    leaf, hub = domains.api("leaf"), domains.api("hub")
    assert _keys(leaf, "cfg") == 200
    assert _keys(hub, "cfg") == 0
    assert get_entry(leaf, "cfg", "k7").data == b"v7"  # type: ignore[union-attr]


def test_commit_markers_with_a_domain_go_to_that_domains_bucket(domains: HubAndLeaf):
    conn = domains.conn("leaf")
    ensure_bucket(conn, "commits", 1)
    write_marker(conn, "commits", "query-1", 7)
    assert read_marker(conn, "commits", "query-1") == 7
    hub = domains.api("hub")
    assert "KV_commits" not in hub.stream_names()
    assert domains.api("leaf").stream_info("KV_commits")["state"]["messages"] == 1


def test_group_configs_with_a_domain_live_in_that_domains_bucket(domains: HubAndLeaf):
    """Created, changed (compare-and-set), deleted and created again in the leaf's ``elastic-consumer-groups``."""
    api = domains.api("leaf")
    api.create_stream({"name": "orders", "subjects": ["orders.*"]})
    config = GroupConfig("elastic", 4, members=("a", "b"), partitioning_filters=(PartitioningFilter("orders.*", (1,)),))
    create_group(api, "orders", "live", config)
    change_members(api, "orders", "live", add=("c",))
    assert load_group(api, "orders", "live")[0].members == ("a", "b", "c")
    delete_group(api, "orders", "live")
    create_group(api, "orders", "live", config)
    assert load_group(api, "orders", "live")[0].members == ("a", "b")
    assert "KV_elastic-consumer-groups" not in domains.api("hub").stream_names()
    entry = get_entry(api, "elastic-consumer-groups", "orders.live")
    assert entry is not None and json.loads(entry.data)["members"] == ["a", "b"]
