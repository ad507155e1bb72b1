"""A streaming query's group (option ``group``): its layout, member consumers, ack floors, pins and claim.

A query with a group holds it for its life: membership changes take effect at batch boundaries, every ack goes
through ``MemberConsumers.acknowledge`` (between batches each member's ack floor equals the last offset in Spark's
commit log), the pins keep other clients out (``pins.PinKeeper`` when the tasks read ranges, with Direct Get or
through consumers of their own; the tasks' pulls when they pull from the member consumers) and
``ownership.GroupClaim`` refuses a second query. A query without a group has none of this: its position lives in
Spark's checkpoint alone (``coordinator``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import GroupConfigError
from spark_jetstream.groups.layout import ELASTIC_BUCKET, STATIC_BUCKET, GroupLayout, Member
from spark_jetstream.groups.resolve import find_group_async, group_key, layout_of, resolve_layout
from spark_jetstream.read.ranges import MemberRange
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.member_consumers import MemberConsumers, check_ack_policy
from spark_jetstream.streaming.ownership import GroupClaim, describe_this_process
from spark_jetstream.streaming.pins import PinKeeper
from spark_jetstream.streaming.waker import Waker

log = logging.getLogger(__name__)

FLOOR_WAIT = 0.5
"""Seconds a Direct Get query waits for its member consumers' floors before the next batch goes on without them."""
LAYOUT_WAIT = 1.0
"""Seconds planning waits for the group's config before the batch keeps the last batch's layout."""
LAYOUT_RETRY = 5.0
"""Seconds after an unanswered look at the group's config during which batches keep the layout without looking."""
CONFIG_LOOK = 30.0
"""Seconds between looks at the group's config when no write to it was seen (``HeldGroup._layout_now``)."""


class HeldGroup:
    """The group one query run reads: made with the query, claimed by ``hold`` once nothing can refuse it."""

    def __init__(self, api: JetStreamApi, config: SourceConfig, source_config: dict[str, Any]) -> None:
        assert config.group is not None
        self.api = api
        self.config = config
        self.name = config.group
        self.source_config = source_config
        self.owner = describe_this_process()
        self.pins: PinKeeper | None = None
        self._claim: GroupClaim | None = None
        layout = resolve_layout(api, source_config, config.group, config.members, create_work_stream=True)
        self.members = MemberConsumers(
            api, layout, config.ack_wait, config.ack_policy, self.owner, config.priority_timeout
        )
        self._layout_unanswered = float("-inf")  # when the group's config last went unanswered
        key = group_key(source_config["name"], config.group)
        subjects = [f"$KV.{bucket}.{key}" for bucket in (STATIC_BUCKET, ELASTIC_BUCKET)]
        self._config_writes = Waker(api.conn, subjects, f"the group's config is looked at every {CONFIG_LOOK:g}s")
        self._config_writes.arm()
        self._looked = time.monotonic()  # when the group's config was last looked at
        self._configured = layout  # the layout that look gave (a replay reads with its own batch's meanwhile)

    @property
    def layout(self) -> GroupLayout:
        return self.members.layout

    @property
    def stream(self) -> str:
        """The stream the members read: an elastic group's work stream."""
        return self.layout.stream

    def hold(self, pulled: bool, retention: str) -> None:
        """Check what the read needs of the group, start keeping the pins unless the tasks pull from the member
        consumers (``pulled``: they hold the pins then) and claim the group, last: a refused query holds nothing. The
        member consumers are made (with this query as their owner) once the group is found free, before this query
        answers for it (``GroupClaim``)."""
        check_ack_policy(self.config.ack_policy, retention, self.layout)
        self.members.check_not_in_use()
        if pulled:
            self._warn_crowded_members()
        else:
            self.pins = PinKeeper(self.members)  # nothing of the query pulls from them: it keeps the pins itself
        members = self.members
        self._claim = GroupClaim(
            self.api.conn, self.source_config["name"], self.name, lambda: members.owner, members.owners
        )
        self._claim.claim(lambda: self.members.ensure(retention))

    def close(self) -> None:
        """Give up the pins and the claim (safe on a half-held group, and twice)."""
        self._config_writes.disarm()
        if self.pins is not None:
            self.pins.stop()
        if self._claim is not None:
            self._claim.release()

    # -- batches -------------------------------------------------------------------------------

    def acknowledge(self, committed: int, retention: str, remade: bool = False, settle: bool = False) -> None:
        """Move the floors to ``committed`` (``MemberConsumers.acknowledge``); fail first if another client is on a
        member consumer.

        When the tasks read ranges (Direct Get, or slices through consumers of their own) the next batch waits at most
        ``FLOOR_WAIT`` for them: nothing of its reads needs a member consumer, and one whose leader is being elected
        (4-9 s after its server crashed) would hold up the query for the whole election. Pulls from the member
        consumers need them: there the floors are always waited for, and so they are with ``settle`` (no batch
        follows: the process may end next).
        """
        if self.pins is not None:
            self.pins.raise_error()
        wait = None if self.pins is None or settle else FLOOR_WAIT  # no pin keeper: the tasks pull from them
        self.members.acknowledge(committed, retention, remade, wait)
        if settle:
            self.members.settle(retention)
        if self.pins is not None:
            self.pins.start()  # the floors are set: a pin's taking delivery can be reset to them

    def next_layout(self) -> GroupLayout:
        """The layout the next batch is planned with (``_layout_now``), recorded in its cut (``streaming.cuts``)."""
        layout = self._layout_now()
        if layout.stream != self.stream:
            raise GroupConfigError(
                f"Group {self.name!r} now reads stream {layout.stream!r} ({layout.kind}) instead of "
                f"{self.stream!r}: the checkpoint's offsets belong to the old stream. Start with a new checkpoint."
            )
        return layout

    def before_batch(self, start: int, retention: str, members: tuple[Member, ...]) -> None:
        """The batch after ``start`` (committed), planned with ``members`` (its cut's layout), is read next: a
        membership change takes effect here, the floors move to ``start`` and, when the query pulls, the member
        consumers are checked for other clients. A replay takes the layout its batch was planned with, whatever the
        group's config says by then (decision 0042); the next batch takes the config's."""
        layout = replace(self.layout, members=members)
        changed = layout != self.layout
        if changed and self.members.acked_through is not None:  # membership changes take effect at a batch boundary
            self.members.change_layout(layout, retention)
        else:  # unchanged, or a new run, whose first acknowledge makes the consumers
            self.members.layout = layout
        self.acknowledge(start, retention, remade=changed)
        if self.pins is None:  # the pin keeper checks the member consumers every 5 s and before floors move
            self.members.check_unchanged()

    def settle(self) -> None:
        """Before a Direct Get batch goes to Spark: a pin's taking delivery reset away (``PinKeeper.settle``)."""
        if self.pins is not None:
            self.pins.settle(FLOOR_WAIT)

    def member_ranges(self, start: int, end: int) -> list[MemberRange]:
        """A pulled batch: one Spark partition per member, pulled from its member consumer."""
        layout = self.layout
        return [
            MemberRange(
                stream=layout.stream,
                consumer=layout.consumer(member),
                start=start,
                end=end,
                partitioned=layout.partitioned,
                include_headers=self.config.include_headers,
            )
            for member in layout.member_names
        ]

    def _layout_now(self) -> GroupLayout:
        """The layout for the next batch. The group's config is looked at after a write to its key was seen (a core
        subscription to both config buckets' subjects for it: a change takes effect at the next batch boundary), and
        every ``CONFIG_LOOK`` whatever was seen (a write in another JetStream domain, a user who may not subscribe
        there): nothing per batch, so the look's ``STREAM.NAMES`` (which only the meta leader answers) is rare. When
        the group's config cannot be read within ``LAYOUT_WAIT`` (telling a missing bucket from an election needs the
        meta leader, and one killed takes 4-9 s to replace), the last batch's layout: the change then takes effect at
        a later boundary, and the query does not stall meanwhile; for ``LAYOUT_RETRY`` after such a look the layout is
        kept without looking."""
        config = self.config
        if time.monotonic() - self._layout_unanswered < LAYOUT_RETRY:
            return self.layout  # still an election: one batch a second would each wait LAYOUT_WAIT
        writes, now = self._config_writes, time.monotonic()
        writes.check()
        if not writes.woken and now - self._looked < CONFIG_LOOK:
            return self._configured
        writes.woken, self._looked = False, now
        lookup = asyncio.wait_for(find_group_async(self.api, self.source_config["name"], self.name), LAYOUT_WAIT)
        try:
            found = self.api.conn.run(lookup)
        except TimeoutError:
            log.info("Group %r's config could not be read in %gs: keeping its layout", self.name, LAYOUT_WAIT)
            self._layout_unanswered = time.monotonic()
            return self.layout
        self._configured = layout_of(self.api, self.source_config, self.name, config.members, found, True)
        return self._configured

    def _warn_crowded_members(self) -> None:
        """Pulling from a member consumer with several filter subjects is ~6x slower than from one
        (measured on nats-server 2.15.1): say so once per query, with the fix."""
        layout = self.layout
        counts = [(member, len(layout.filter_subjects(member))) for member in layout.member_names]
        crowded = [(member, count) for member, count in counts if count > 1]
        if crowded:
            member, count = crowded[0]
            log.warning(
                "Group %r is read by pulling from its member consumers, and member %r (%d partitions%s) reads several "
                "times slower than a member with one partition. Direct Get (readMode=auto or direct, on a stream with "
                "`allow_direct`: `nats stream edit %s --allow-direct`) reads every partition in parallel.",
                layout.group,
                member,
                count,
                f", and {len(crowded) - 1} more members alike" if len(crowded) > 1 else "",
                self.stream,
            )
