"""A group's member consumers on the driver: made to match the layout, and their ack floors moved.

``MemberConsumers.acknowledge`` is the only code that moves ack floors: it RESETs every member
consumer to the committed watermark (the ack on commit), and the first time in a query run it
reconciles floors left behind or ahead by an earlier run. Each consumer's floor is moved by a task of
its own, so a consumer whose leader is being elected holds up neither the others nor, on the Direct Get
path (``wait``), the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from spark_jetstream.client.features import GROUPS, leader_version, shown, supports
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import (
    ApiError,
    ConsumerNotFoundError,
    DataLossError,
    GroupConfigError,
    NotPermittedError,
    OptionError,
    ServerTooOldError,
)
from spark_jetstream.groups.layout import OWNER_METADATA_KEY, GroupLayout
from spark_jetstream.options import ACK_POLICIES, DEFAULT_PRIORITY_TIMEOUT
from spark_jetstream.read.start import member_infos
from spark_jetstream.streaming.faults import fault_point

log = logging.getLogger(__name__)

_WORKQUEUE_OVERLAP = (10099, 10100)  # unfiltered or overlapping consumers on a WorkQueue stream


def check_ack_policy(ack_policy: str, retention: str, layout: GroupLayout) -> None:
    """``ackPolicy=none`` makes delivery count as the ack: only a Limits stream then keeps the
    messages of an uncommitted batch for its replay (on a WorkQueue stream the server refuses
    such consumers; on an Interest stream it would drop the messages at delivery)."""
    if ack_policy == "none" and retention != "limits":
        where = f"stream {layout.stream!r}"
        if layout.kind == "elastic":
            where = f"the work stream {layout.stream!r} of elastic group {layout.group!r}"
        raise OptionError(
            f"ackPolicy=none needs a stream with Limits retention, but {where} has {retention} retention, "
            "where a message delivered to an ack-none consumer counts as acked before Spark commits it. "
            "Remove the ackPolicy option."
        )


class MemberConsumers:
    """The member consumers of one group on the stream its members read (``layout.stream``)."""

    def __init__(
        self,
        api: JetStreamApi,
        layout: GroupLayout,
        ack_wait: float,
        ack_policy: str,
        owner: str,
        priority_timeout: float = DEFAULT_PRIORITY_TIMEOUT,
    ) -> None:
        self.api = api
        self.layout = layout
        self.ack_wait = ack_wait
        self.ack_policy = ack_policy
        self.owner = owner
        self.priority_timeout = priority_timeout
        self.acked_through: int | None = None  # the committed watermark every floor is moved to
        self.moved: dict[str, int] = {}  # consumer -> the watermark its floor was last reset to
        # per consumer, held while its floor moves, so another RESET (a pin's taking) never lands in between
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.before_reset: Callable[[str], Awaitable[object]] | None = None  # a check that a RESET would erase
        self.error: Exception | None = None  # why a floor could not be moved
        self._movers: dict[str, asyncio.Task[None]] = {}
        # layout changes started plus ended: odd while the consumers are being made to match a new layout
        self.layout_changes = 0
        self.made: set[str] = set()  # member consumers this run created: none of them holds a position of the group

    @property
    def stream(self) -> str:
        return self.layout.stream

    def infos(self) -> dict[str, dict[str, Any] | None]:
        return member_infos(self.api, self.layout)

    def owners(self) -> set[str]:
        """The owners the member consumers' metadata names: the query that wrote each last."""
        infos = self.infos().values()
        return {
            owner
            for info in infos
            if info and (owner := (info["config"].get("metadata") or {}).get(OWNER_METADATA_KEY))
        }

    # -- making them -----------------------------------------------------------------------------

    def change_layout(self, layout: GroupLayout, retention: str) -> None:
        """Take ``layout`` and make the consumers match it. Until they do, they differ from what the layout
        says; ``layout_changes`` tells a concurrent check (the pin keeper's) to look again later."""
        self.layout_changes += 1
        try:
            self.layout = layout
            self.ensure(retention)
        finally:
            self.layout_changes += 1

    def ensure(self, retention: str) -> None:
        """Make the member consumers match the layout: create, update, and delete those of members
        that left (only consumers this connector made, or any group consumer in the way on a
        WorkQueue stream, where two consumers may not share subjects even for a moment)."""
        layout = self.layout
        metadata = self.metadata
        wanted = {layout.consumer(m): layout.filter_subjects(m) for m in layout.member_names}
        existing = self._configs(self._group_consumers())
        self._check_existing_ack_policy({name: config for name, config in existing.items() if name in wanted})
        workqueue = retention == "workqueue"
        stale = [
            name
            for name, config in existing.items()
            if (name not in wanted and OWNER_METADATA_KEY in (config.get("metadata") or {}))
            or (workqueue and config.get("filter_subjects", [config.get("filter_subject")]) != wanted.get(name))
        ]
        if workqueue:  # free the subjects before another member takes them
            for name in stale:
                self._delete(name)
        configs = [
            layout.consumer_config(member, self.ack_wait, metadata, self.ack_policy, self.priority_timeout)
            for member in layout.member_names
        ]

        async def create() -> list[Any]:
            calls = (self.api.create_consumer_async(self.stream, config) for config in configs)
            return list(await asyncio.gather(*calls, return_exceptions=True))

        results = self.api.conn.run(create())
        if (refused := next((r for r in results if isinstance(r, NotPermittedError)), None)) is not None:
            self._adopt(refused)
            return
        for member, created in zip(layout.member_names, results, strict=True):
            if isinstance(created, ApiError):
                raise self._create_error(layout.consumer(member), created)
            if isinstance(created, BaseException):
                raise created
        self.made.update(set(wanted) - set(existing))
        if not workqueue:  # on other streams the new consumers hold the interest before the old go
            for name in stale:
                self._delete(name)

    def _adopt(self, refused: NotPermittedError) -> None:
        """The NATS user may not create or update consumers (``refused``): read the member consumers as an admin made
        them, when every one exists with the config the layout gives it (its metadata aside), and take the owner their
        metadata names as this query's (its answers on the owner subject then match them)."""
        layout, stream = self.layout, self.stream
        infos = self.infos()
        if missing := [layout.consumer(member) for member, info in infos.items() if info is None]:
            raise GroupConfigError(
                f"The NATS user may not create the member consumers of group {layout.group!r} ({refused}), and "
                f"{', '.join(missing)} on stream {stream!r} does not exist: have them made once by a user who may "
                "(a run of the query), or allow the user to create them (`spark-jetstream rights` lists the subjects)."
            )
        owners = {(info["config"].get("metadata") or {}).get(OWNER_METADATA_KEY, "") for info in infos.values() if info}
        owner = owners.pop() if len(owners) == 1 else ""
        metadata = {OWNER_METADATA_KEY: owner} if owner else {}
        for member, info in infos.items():
            wanted = layout.consumer_config(member, self.ack_wait, metadata, self.ack_policy, self.priority_timeout)
            if info is not None and (changes := _changes(wanted, info)):
                raise GroupConfigError(
                    f"Member consumer {layout.consumer(member)!r} on stream {stream!r} is not as this query reads it "
                    f"({'; '.join(changes)}), and the NATS user may not update it ({refused}): have a user who may "
                    "update consumers run the query once with these options, or allow this one to."
                )
        self.owner = owner
        log.warning(
            "The NATS user may not create or update the member consumers of group %r: reading them as they are (made "
            "by %s)",
            layout.group,
            owner or "another client",
        )

    @property
    def metadata(self) -> dict[str, str]:
        """The metadata the member consumers carry: this query as their owner (none when it may not write them and
        the consumers name no owner)."""
        return {OWNER_METADATA_KEY: self.owner} if self.owner else {}

    def check_not_in_use(self) -> None:
        """Refuse, before anything of the group changes, member consumers another client is consuming: one the
        connector did not make (no owner metadata: a pcgroups member's, or a tool's) that is pinned to a client or
        has pull requests waiting. The query would rewrite their configs and take their pins, and on a WorkQueue
        stream find their acks past its checkpoint. Consumers the connector made are another query's
        (``ownership.GroupClaim``) or an earlier run's, whose pins it takes over."""
        for member, info in self.infos().items():
            if info is None or OWNER_METADATA_KEY in (info["config"].get("metadata") or {}):
                continue
            seen = [
                f"is pinned to client {state['pinned_client_id']!r} (priority group {state.get('group')!r})"
                for state in info.get("priority_groups") or ()
                if state.get("pinned_client_id")
            ]
            if info.get("num_waiting"):
                seen.append(f"has {info['num_waiting']} pull requests waiting")
            if seen:
                timeout = info["config"].get("priority_timeout")
                release = f" (a pin is released {timeout / 1e9:g}s after its client's last pull)" if timeout else ""
                raise GroupConfigError(
                    f"Group {self.layout.group!r} on stream {self.stream!r} is being consumed by other clients: "
                    f"member consumer {self.layout.consumer(member)!r}, which spark-jetstream did not make, "
                    f"{' and '.join(seen)}. The query changes nothing of a group in use (it would rewrite the member "
                    f"consumers and take their pins): stop those clients{release} and start the query again, or "
                    "give Spark a group of its own."
                )

    def _configs(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """The config of each named consumer that still exists, asked all at once."""
        infos = self.api.conn.run(self.api.consumer_infos_async(self.stream, names))
        return {name: info["config"] for name, info in infos.items() if info is not None}

    def check_unchanged(self) -> None:
        """Raise ``changed_error`` for the member consumers as they are now."""
        if (error := self.changed_error(self.infos())) is not None:
            raise error

    def changed_error(self, infos: dict[str, dict[str, Any] | None]) -> GroupConfigError | None:
        """The error for a member consumer another client deleted or changed since this query made it
        (``infos``: member -> consumer info): a pcgroups member joining the same group, for one, rewrites
        ``ack_wait``, ``priority_timeout`` and ``max_ack_pending`` with its own template. Names the
        fields, old -> new."""
        metadata = self.metadata
        for member, info in infos.items():
            consumer = self.layout.consumer(member)
            if info is None:
                return GroupConfigError(
                    f"Member consumer {consumer!r} on stream {self.stream!r} was deleted by another client while "
                    "this query reads it: stop that client, or give Spark a group of its own; restarting the query "
                    "makes the consumer again."
                )
            wanted = self.layout.consumer_config(
                member, self.ack_wait, metadata, self.ack_policy, self.priority_timeout
            )
            changes = _changes(wanted, info)
            earlier = (info["config"].get("metadata") or {}).get(OWNER_METADATA_KEY)
            if changes and earlier and earlier != self.owner:
                return GroupConfigError(
                    f"Member consumer {consumer!r} on stream {self.stream!r} went back to how an earlier run of a "
                    f"spark-jetstream query left it ({'; '.join(changes)}): its server's store was put back to an "
                    "earlier copy (a restored backup or disk snapshot, or writes lost before they were synced to "
                    "disk), and its ack floor with it. Restart the query: it checks the stream against its "
                    "checkpoint (failOnDataLoss)."
                )
            if changes:
                return GroupConfigError(
                    f"Member consumer {consumer!r} on stream {self.stream!r} was changed by another client while "
                    f"this query reads it ({'; '.join(changes)}): stop that client (a pcgroups member or tool that "
                    f"joins group {self.layout.group!r} rewrites its member consumers), or give Spark a group of "
                    "its own; restarting the query makes the consumers again."
                )
        return None

    def _check_existing_ack_policy(self, existing: dict[str, dict[str, Any]]) -> None:
        """An ack policy cannot be changed on a consumer: say so before the server refuses the update."""
        wanted = self.ack_policy
        other = sorted(name for name, config in existing.items() if config.get("ack_policy") != wanted)
        if not other:
            return
        policy = existing[other[0]].get("ack_policy")
        remake = (
            f"delete the member consumers {', '.join(other)} and let the query make them again: it resumes from "
            "its checkpoint (a new query starts at startingPosition, default earliest)."
        )
        if policy not in ACK_POLICIES:  # made by hand with a policy the connector never uses (AckAll)
            raise GroupConfigError(
                f"Member consumer {other[0]!r} on stream {self.stream!r} has ack policy {policy!r}, which "
                f"spark-jetstream does not read with (ackPolicy is one of {', '.join(ACK_POLICIES)}), and a "
                f"consumer's ack policy cannot change: {remake}"
            )
        raise GroupConfigError(
            f"Member consumer {other[0]!r} on stream {self.stream!r} has ack policy {policy!r}, but this query "
            f"reads with ackPolicy={wanted}, and a consumer's ack policy cannot change. Set "
            f".option('ackPolicy', '{policy}'), or {remake}"
        )

    def _group_consumers(self) -> list[str]:
        """Consumers on the read stream that belong to this group."""
        names = self.api.consumer_names(self.stream)
        if self.layout.kind == "elastic":
            return names  # the work stream exists for this group alone
        return [name for name in names if name.startswith(f"{self.layout.group}-")]

    def _delete(self, name: str) -> None:
        log.info("Deleting consumer %s of group %s: membership changed", name, self.layout.group)
        with contextlib.suppress(ConsumerNotFoundError):
            self.api.delete_consumer(self.stream, name)

    def _create_error(self, consumer: str, exc: ApiError) -> GroupConfigError:
        if exc.err_code in _WORKQUEUE_OVERLAP:
            others = [name for name in self.api.consumer_names(self.stream) if name != consumer]
            return GroupConfigError(
                f"Cannot create member consumer {consumer!r}: stream {self.stream!r} is a WorkQueue stream and "
                f"another consumer ({', '.join(others) or 'unknown'}) already takes overlapping subjects. Delete "
                "that consumer, or read the stream through an elastic group."
            )
        return GroupConfigError(
            f"Cannot create or update member consumer {consumer!r} on stream {self.stream!r}: {exc}. If it was "
            "created by other tooling with an incompatible config, delete it or use another group name."
        )

    # -- ack floors ------------------------------------------------------------------------------

    def acknowledge(self, committed: int, retention: str, remade: bool = False, wait: float | None = None) -> None:
        """Spark committed everything up to ``committed``: make every ack floor equal it. The one place
        ack floors move.

        The first time in a run this reconciles: a consumer behind is moved forward; one ahead
        (acked data Spark never committed) is an error unless the stream keeps acked messages.
        ``remade``: the consumers were just made for a new layout, so every floor is set again.
        ``wait``: at most this long for the floors (None: until they moved); a consumer without a
        leader then moves its floor when it has one again (never past the commit), and a floor that
        cannot be moved at all fails the next call.
        """
        if self.error is not None:
            raise self.error
        if self.acked_through is None:
            self._reconcile(committed, retention)
        elif remade or committed > self.acked_through:
            self._move_floors(committed, retention, None if remade else wait, everyone=remade)

    def settle(self, retention: str) -> None:
        """Wait until every floor move at work is done (each ends within the API deadline: moved, or an error)."""
        self._wait(self.layout.member_names, retention, None)

    def _move_floors(self, seq: int, retention: str, wait: float | None, everyone: bool = False) -> None:
        """Move every member consumer's ack floor to ``seq`` (``everyone``: also those already there).

        On a WorkQueue stream a RESET does not remove the messages it skips (measured on 2.15.1;
        Interest streams do drop them), so the member's subjects below ``seq + 1`` are purged too.
        """
        self.acked_through = seq
        if everyone:
            self.moved.clear()
        members = self.layout.member_names
        self._wait(members[:1], retention, wait)
        if seq > 0:
            fault_point("commit")  # a crash with only some floors moved
        self._wait(members[1:], retention, wait)

    def _wait(self, members: list[str], retention: str, wait: float | None) -> None:
        """Start the floor movers of ``members`` and wait up to ``wait`` seconds for them (None: until they are done,
        with those still at work from an earlier call). A mover still at work from an earlier call is not waited for
        again: its consumer has had no leader for at least ``wait``, and it moves the floor once it has one."""

        async def moved() -> None:
            movers = [task for member in members if (task := self._mover(member, retention, wait is None))]
            if movers:
                await asyncio.wait(movers, timeout=wait)

        self.api.conn.run(moved())
        if self.error is not None:
            raise self.error

    def _mover(self, member: str, retention: str, join: bool = True) -> asyncio.Task[None] | None:
        """The task moving ``member``'s floor to ``acked_through`` (loop thread): a new one, or the one at work (it
        moves on to the new target when done), which ``join`` returns and otherwise None."""
        consumer = self.layout.consumer(member)
        if (running := self._movers.get(consumer)) is not None:
            return running if join else None

        async def move() -> None:
            try:
                while (target := self.acked_through or 0) > self.moved.get(consumer, -1):
                    async with self.locks[consumer]:
                        target = self.acked_through or 0
                        if self.before_reset is not None:
                            await self.before_reset(consumer)
                        await self.api.reset(self.stream, consumer, target + 1)
                        self.moved[consumer] = target
                    if retention == "workqueue":
                        subjects = self.layout.filter_subjects(member) or [""]
                        await asyncio.gather(*(self.api.purge_below(self.stream, target + 1, s) for s in subjects))
            except Exception as exc:  # the query fails at its next call, with this error
                self.error = self.error or exc
            finally:
                del self._movers[consumer]

        task = self._movers[consumer] = asyncio.get_running_loop().create_task(move())
        return task

    def _removed_after(self, committed: int, floor: int) -> bool:
        """Whether a message with ``committed < seq <= floor`` left the stream."""
        state = self.api.stream_info(self.stream, deleted_details=True)["state"]
        return state["first_seq"] > committed + 1 or any(committed < s <= floor for s in state.get("deleted") or ())

    def _reconcile(self, committed: int, retention: str) -> None:
        self.ensure(retention)
        infos = self.infos()
        for member, info in infos.items():  # RESET and pins are served by each consumer's leader
            if info is not None and not supports(leader_version(info), GROUPS):
                consumer, running = self.layout.consumer(member), shown(leader_version(info))
                raise ServerTooOldError(
                    f"Member consumer {consumer!r} on stream {self.stream!r} is led by a server that runs nats-server "
                    f"{running}, but {GROUPS.name} need {GROUPS.shown_since} or newer on the server that leads each "
                    "member consumer (they are served there, not by the server the query connects to): finish "
                    f"upgrading the servers, or move its leader (`nats consumer cluster step-down {self.stream} "
                    f"{consumer}`)."
                )
        for member, info in infos.items():
            floor = info["ack_floor"]["stream_seq"] if info else 0
            # A floor also runs ahead over seqs its filter does not match (other members' messages):
            # that is harmless while every message above the checkpoint is still there.
            ahead = floor > committed and retention != "limits"
            if ahead and self._removed_after(committed, floor):
                raise DataLossError(
                    f"Member consumer {self.layout.consumer(member)!r} has acked up to seq {floor}, past the "
                    f"checkpoint's seq {committed}, and stream {self.stream!r} ({retention} retention) has "
                    f"removed acked messages: seqs {committed + 1}..{floor} cannot be replayed. Was the group read "
                    "by another client, or the checkpoint replaced? Start with a new checkpoint to continue from "
                    "the group's position."
                )
            if floor != committed:
                consumer = self.layout.consumer(member)
                log.info("Moving %s's ack floor from %d to the checkpoint %d", consumer, floor, committed)
        self._move_floors(committed, retention, None, everyone=True)


_DURATIONS = ("ack_wait", "priority_timeout")


def _changes(wanted: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """``field old -> new`` for each field of ``wanted`` the consumer's config no longer has."""

    def shown(key: str, value: Any) -> str:
        if key in _DURATIONS and isinstance(value, int):
            return f"{value / 1e9:g}s"
        return "(none)" if value is None else repr(value) if isinstance(value, str) else str(value)

    config = info["config"]
    changes = []
    for key, value in wanted.items():
        if key == "metadata":
            for name, expected in value.items():
                found = (config.get("metadata") or {}).get(name)
                if found != expected:
                    changes.append(f"metadata {name} {shown(name, expected)} -> {shown(name, found)}")
        elif key == "filter_subjects":
            single = config.get("filter_subject")
            found = config.get("filter_subjects") or ([single] if single else [])
            if found != value:
                changes.append(f"filter_subjects {value} -> {found}")
        elif config.get(key) != value:
            changes.append(f"{key} {shown(key, value)} -> {shown(key, config.get(key))}")
    return changes
