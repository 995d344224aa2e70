"""The moves of a StatefulSet's rollout, counted for the ShardSet's status
(`status.lastRollout`, shown by `kubectl shardlease describe`).

A rollout starts when the StatefulSet's `updateRevision` differs from its
`currentRevision` (a new pod template: `kubectl rollout restart`, an image
change) and names a revision not counted yet. It ends once the StatefulSet
says every replica is at the update revision and Ready, and a ShardSet
status published after that (`observedTime`, to the second, the agents'
clock) says Balanced over as many live pods as there are replicas: the
shards settle a few rounds after the last pod is back (until its agent is
seen live, the status still says Balanced over the others, and one
published before the last pod's restart says so over all of them).
In between, every change of a shard's owner in the published status is a
move; a shard going unowned and back to the same pod (a hold, a restart in
place) is none.

The moves are those the status shows: it is published at most once per
interval, so a shard that moved twice within one interval counts once.
Counted by the operator that leads, in memory, from the owners it saw last:
a new leader picks up the record and goes on from the owners it first sees,
missing the moves in between; a record written by another leader meanwhile
wins over what a replica that leads again remembers. A StatefulSet with the
OnDelete strategy, or a partitioned rolling update, is "going on" until
every pod is at the update revision.

Everything here is a pure function of the objects' bodies, tested by tables
(tests/test_rollouts.py); the operator reads, calls and writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

__all__ = ["Progress", "Rollout", "Tracking", "count_moves", "progress", "step"]


class Rollout(BaseModel):
    """`status.lastRollout`, as written (camelCase on the wire)."""

    model_config = ConfigDict(extra="ignore")

    #: The StatefulSet's update revision (its ControllerRevision's name).
    revision: str = Field(min_length=1)
    started_at: str = Field(serialization_alias="startedAt",
                            validation_alias=AliasChoices("startedAt", "started_at"))
    #: None while the rollout goes on.
    finished_at: str | None = Field(default=None, serialization_alias="finishedAt",
                                    validation_alias=AliasChoices("finishedAt", "finished_at"))
    moves: int = Field(default=0, ge=0)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)

    @classmethod
    def parse(cls, raw: object) -> Rollout | None:
        """The record in a status, or None if there is none or it cannot be
        read (then a new one is started: a counter is informational)."""
        if not isinstance(raw, Mapping):
            return None
        try:
            return cls.model_validate(raw)
        except ValidationError:
            return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """What a StatefulSet's status says of its rollout."""

    #: The revision pods are being moved to; None if the status has none yet.
    revision: str | None
    #: Pods are being replaced: the update revision is not the current one
    #: (a scale-up or a pod's restart is no rollout).
    rolling: bool
    #: No rollout, and every replica is at the update revision and Ready.
    settled: bool


def progress(sts: Mapping[str, Any]) -> Progress:
    """The rollout a StatefulSet's body shows."""
    spec, status = sts.get("spec") or {}, sts.get("status") or {}
    meta = sts.get("metadata") or {}
    update, current = status.get("updateRevision"), status.get("currentRevision")
    if not isinstance(update, str) or not update:
        return Progress(revision=None, rolling=False, settled=False)
    replicas = spec.get("replicas", 1)
    rolling = update != current
    seen = (status.get("observedGeneration") or 0) >= (meta.get("generation") or 0)
    settled = (seen and not rolling and (status.get("updatedReplicas") or 0) >= replicas
               and (status.get("readyReplicas") or 0) >= replicas)
    return Progress(revision=update, rolling=rolling, settled=settled)


def count_moves(last: Mapping[str, str], owners: Mapping[str, str]) -> tuple[int, dict[str, str]]:
    """The moves from `last` (each shard's last known owner) to `owners` (the
    owners now published; an unowned shard is absent), and the new last
    known owners: an unowned shard keeps its last owner, so that it going
    back to that pod is no move."""
    moves = sum(1 for s, o in owners.items() if s in last and last[s] != o)
    return moves, {**last, **owners}


@dataclass(kw_only=True, slots=True)
class Tracking:
    """The operator's memory of one ShardSet's rollout."""

    record: Rollout
    #: Each shard's last known owner.
    last: dict[str, str] = field(default_factory=dict)
    #: The record this operator last wrote (or took up): a different one of
    #: the same rollout in the status was written by another leader since,
    #: and wins over this memory.
    wrote: Rollout | None = None
    #: When the StatefulSet was first seen settled (`now`'s form): only a
    #: status published after that (`observedTime`) can say the shards
    #: settled too; an older one may predate the last pod's restart.
    settled_at: str | None = None


def step(tracking: Tracking | None, sts: Mapping[str, Any], shardset: Mapping[str, Any],
         now: str) -> tuple[Tracking | None, Rollout | None]:
    """One look at both objects: the new tracking, and the record to write
    (None: nothing to write, the status already says it)."""
    status = shardset.get("status") or {}
    raw_owners = status.get("owners")
    owners = {str(k): v for k, v in raw_owners.items() if isinstance(v, str)} \
        if isinstance(raw_owners, Mapping) else {}
    written = Rollout.parse(status.get("lastRollout"))
    seen = progress(sts)
    if tracking is not None and written is not None \
            and written.revision == tracking.record.revision \
            and written not in (tracking.record, tracking.wrote):
        # Another leader counted this rollout while this one did not lead:
        # its record wins (this memory missed what it saw).
        tracking = None
    if tracking is None and written is not None and written.finished_at is None:
        # A rollout counted by an earlier leader (or before a restart).
        tracking = Tracking(record=written, last=dict(owners), wrote=written)
    if seen.revision is not None and seen.rolling and (
            tracking is None or tracking.record.revision != seen.revision):
        # A new rollout (or a second one started before the first ended: its
        # moves are the new one's from here on).
        if written is not None and written.revision == seen.revision:
            record = written  # this one, counted before this operator saw it
        else:
            record = Rollout(revision=seen.revision, started_at=now)
        tracking = Tracking(record=record, last=dict(owners),
                            wrote=record if record == written else None)
    if tracking is None:
        return None, None
    record = tracking.record
    if record.finished_at is None:
        moves, tracking.last = count_moves(tracking.last, owners)
        record = record.model_copy(update={"moves": record.moves + moves})
        if not seen.settled:
            tracking.settled_at = None
        elif tracking.settled_at is None:
            tracking.settled_at = now
        published = status.get("observedTime")
        if seen.settled and _balanced(status, _replicas(sts)) and isinstance(published, str) \
                and tracking.settled_at is not None and published > tracking.settled_at:
            # (Also a rollout rolled back: the pods are all at one revision.)
            record = record.model_copy(update={"finished_at": now})
        tracking.record = record
    if record.finished_at is not None:
        done = None if written == record else record
        return None, done
    return tracking, None if written == record else record


def _replicas(sts: Mapping[str, Any]) -> int:
    replicas = (sts.get("spec") or {}).get("replicas", 1)
    return replicas if isinstance(replicas, int) else 1


def _balanced(status: Mapping[str, Any], replicas: int) -> bool:
    if status.get("liveNodes") != replicas:
        return False
    return any(c.get("type") == "Balanced" and c.get("status") == "True"
               for c in status.get("conditions") or [] if isinstance(c, Mapping))
