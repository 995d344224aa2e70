"""The records that cross the store boundary, and their (untrusted) decoding.

Lease and heartbeat bytes come from a shared store that anything may write, so
they are size-bounded and validated before use. A record that fails becomes a
`CorruptRecord` error in a `Stored` entry: the loop reports it and treats the
shard as held until it expires, and never routes to anything read from it.

Every record carries the `format` it was written in (records written before
the field read as 1). A record whose format is newer than `FORMAT` is never
validated against this version's models, since a newer format may change
anything: it reads as a `Stored` entry without a record, its `newer_format`
set, and otherwise like a corrupt one (held until it expires; the generation
its bytes show is recovered), or as `NewerFormat` from the `decode_*`
functions. A change of the record format is then safe by construction: bump
`FORMAT`, and a node of an older version never acts on what it cannot read.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardlease.errors import CorruptRecord

#: The record format this version writes and knows. A record of a higher
#: format is not read (see the module doc); one below 1 is corrupt.
FORMAT = 1

#: Largest lease or heartbeat record accepted from a store, in bytes.
MAX_RECORD_BYTES = 4096

#: Longest lease lifetime a record may carry, in seconds. The loop waits
#: max(its own TTL, the record's) before taking an unchanged record over, so
#: an unbounded `ttl` written by hand or by a broken writer would pin a shard
#: forever; a record above this is corrupt (reported, held for the reader's own
#: TTL). `Options.lease_ttl` has the same bound, so no node writes one.
MAX_LEASE_TTL = 3600.0
#: Longest reservation (`Lease.hold`, `Epoch.hold`), seconds.
MAX_HOLD = 3600.0
#: Largest generation recovered from a corrupt record: the range of a signed
#: 64-bit integer, where applications keep the fencing token.
_MAX_GENERATION = 2**63 - 1

#: The most shards an epoch record lists in `keeps` (the most a ShardSet may
#: have); a node keeping a higher one writes `keeps=None` (every shard).
MAX_KEEPS_SHARD = 8191
_KEEPS_CHARS = 4 * (((MAX_KEEPS_SHARD + 8) // 8 + 2) // 3)

NodeName = str
#: How a node keeps the leases it holds (see `Lease.renewal`).
Renewal = Literal["shard", "node"]


def new_write_id() -> str:
    """A nonce put in every write: it makes each renewal a visible change (S3
    ETags are content hashes) and lets a writer whose answer was lost recognise
    its own write on re-read."""
    return uuid.uuid4().hex


class NewerFormat(CorruptRecord):
    """A record written in a format newer than `FORMAT`: not read, never
    trusted, held like a corrupt record (it is one, to this version)."""

    def __init__(self, kind: str, format: int) -> None:
        super().__init__(f"{kind} record is format {format}, newer than the format {FORMAT} "
                         "this version knows: not read (written by a newer shardlease?)")
        self.format = format


def encode_shards(shards: Iterable[int]) -> str | None:
    """A set of shards as a bitmap (bit i of byte i // 8: shard i), in
    base64: at most 1,368 characters for 8,192 shards, however scattered.
    None if a shard is above MAX_KEEPS_SHARD."""
    shards = list(shards)
    if not shards:
        return ""
    top = max(shards)
    if top > MAX_KEEPS_SHARD or min(shards) < 0:
        return None
    bits = bytearray(top // 8 + 1)
    for shard in shards:
        bits[shard // 8] |= 1 << (shard % 8)
    return base64.b64encode(bytes(bits)).decode()


def decode_shards(text: str) -> frozenset[int]:
    """The shards of an `encode_shards` bitmap; raises `CorruptRecord` if it is none."""
    try:
        bits = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise CorruptRecord(f"not a shard bitmap: {e}") from None
    return frozenset(8 * i + b for i, byte in enumerate(bits) for b in range(8)
                     if byte >> b & 1)


class Lease(BaseModel):
    """One shard's lease. `generation` is the fencing token handed to the host."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    cluster: str = Field(min_length=1, max_length=63)
    shard: int = Field(ge=0)
    owner: NodeName | None = Field(default=None, min_length=1, max_length=253)
    generation: int = Field(ge=0)
    #: The owning process (random per start): a restarted node with the same
    #: name is another incarnation and must not take the old one's lease as its own.
    incarnation: str | None = Field(default=None, max_length=64)
    write_id: str = Field(min_length=1, max_length=64)
    #: Wall-clock seconds of the write; informational only (clock skew), never
    #: used to judge expiry.
    renewed_at: float = 0.0
    #: Wall-clock seconds since which the lease has had this owner (or none):
    #: set by a claim or a free, kept by renewals. Informational, like
    #: renewed_at (`shardlease owners` shows it); 0 in records older than it.
    since: float = 0.0
    ttl: float = Field(gt=0, le=MAX_LEASE_TTL)
    #: How the lease is kept: "shard", its owner rewrites this record every
    #: interval (judged by this record's version changing); "node", it is valid
    #: while the owner's epoch (`owner`, `incarnation`) is alive, and the record
    #: is written only on a claim or a free (judged by the epoch's record).
    #: Records older than the field are "shard".
    renewal: Renewal = "shard"
    #: A free lease kept for the node of this name (a pod being replaced
    #: under `handoff: hold`, StatefulSet pod names being stable): peers leave
    #: it alone until they have seen this version unchanged for `hold`
    #: seconds; the node of that name claims it at once. Placement only:
    #: claims stay compare-and-swaps, and a version that ignores the field
    #: sees a free lease (a move, never two owners).
    reserved_for: NodeName | None = Field(default=None, min_length=1, max_length=253)
    hold: float = Field(default=0.0, ge=0, le=MAX_HOLD)
    #: The record format (see `FORMAT`); records older than the field are 1.
    format: int = Field(default=FORMAT, ge=1, strict=True)

    def reserved(self) -> str | None:
        """The node this free lease is kept for, if any."""
        return self.reserved_for if self.owner is None and self.hold > 0 else None


class Epoch(BaseModel):
    """One incarnation of a node, as a liveness record (node-mode renewal).

    The owner rewrites it every interval with a compare-and-swap on its last
    version; every lease it holds in node mode stays valid while it does.
    Another node ends it, once it has seen one version unchanged for a whole
    TTL, by a compare-and-swap that writes `ended_by`: from then on the
    owner's writes are refused, and its leases may be claimed.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    cluster: str = Field(min_length=1, max_length=63)
    node: NodeName = Field(min_length=1, max_length=253)
    epoch: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9]+$")
    seq: int = Field(ge=0)
    write_id: str = Field(min_length=1, max_length=64)
    at: float = 0.0
    #: The owner's lease TTL for the whole epoch (informational: readers wait
    #: the TTL written in the leases of the epoch).
    ttl: float = Field(gt=0, le=MAX_LEASE_TTL)
    #: Who ended the epoch; None while the owner keeps it.
    ended_by: NodeName | None = Field(default=None, min_length=1, max_length=253)
    #: The shards the owner keeps open by this epoch as of this write, as a
    #: bitmap (`encode_shards`). A peer that finds a lease record damaged and
    #: never saw who kept it learns it here (docs/renewal.md, "Records written
    #: by others"). None: not said (every shard may be kept).
    keeps: str | None = Field(default=None, max_length=_KEEPS_CHARS,
                              pattern=r"^[A-Za-z0-9+/]*={0,2}$")
    #: Set by the owner's graceful stop under `handoff: hold` (ended by
    #: itself): the leases of the epoch are kept for the node of this name,
    #: like `Lease.reserved_for`, for `hold` seconds from when a peer first
    #: reads the record ended.
    hold: float = Field(default=0.0, ge=0, le=MAX_HOLD)
    #: The record format (see `FORMAT`); records older than the field are 1.
    format: int = Field(default=FORMAT, ge=1, strict=True)


class Heartbeat(BaseModel):
    """One node's heartbeat. Liveness is judged from its version changing."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    cluster: str = Field(min_length=1, max_length=63)
    node: NodeName = Field(min_length=1, max_length=253)
    incarnation: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=0)
    write_id: str = Field(min_length=1, max_length=64)
    at: float = 0.0
    #: Shard mode: the longest TTL that any lease this node holds was last
    #: written with, by a write that landed, or the TTL it writes new ones
    #: with if longer (no lease of it carries more than its last landed
    #: heartbeat said: regression seed-3062478051). A node whose
    #: application refused an open as outdated keeps the shard from every
    #: node for at least the longest of these (`keeper.refusal_hold`): the
    #: owner whose record was deleted under it may be one that the refusing
    #: node never saw, valid by a TTL longer than any it saw (a TTL cut in
    #: place, regression seed-143). Records older than the field read as 0.
    holds_by: float = Field(default=0.0, ge=0, le=MAX_LEASE_TTL)
    #: The record format (see `FORMAT`); records older than the field are 1.
    format: int = Field(default=FORMAT, ge=1, strict=True)


R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Stored(Generic[R]):
    """A record as read from a store, with the version a compare-and-swap needs.

    `record` is None when the bytes were not a valid record; `error` says why,
    and `recovered_generation` is the generation that could still be read from
    the raw record (None if nothing could), so that a claim over a corrupt
    record never hands out a generation the record already passed.
    `newer_format` is set (with `record` None) when the record is of a format
    newer than `FORMAT`: valid or not, this version does not read it.
    """

    version: str
    record: R | None
    error: str | None = None
    recovered_generation: int | None = None
    newer_format: int | None = None

    @property
    def generation(self) -> int | None:
        """The generation a claim over this record must go above: the valid
        record's own, or the one recovered from a corrupt one (None: none known)."""
        if self.record is not None:
            generation = getattr(self.record, "generation", None)
            return generation if isinstance(generation, int) else None
        return self.recovered_generation


def encode(record: BaseModel) -> bytes:
    return record.model_dump_json(exclude_none=False).encode()


def decode_lease(data: bytes, cluster: str, shard: int) -> Lease:
    lease = _decode(Lease, data)
    if lease.cluster != cluster or lease.shard != shard:
        raise CorruptRecord(
            f"lease record names cluster {lease.cluster!r} shard {lease.shard}, "
            f"but is stored as cluster {cluster!r} shard {shard}"
        )
    return lease


def decode_heartbeat(data: bytes, cluster: str, node: str) -> Heartbeat:
    hb = _decode(Heartbeat, data)
    if hb.cluster != cluster or hb.node != node:
        raise CorruptRecord(
            f"heartbeat names cluster {hb.cluster!r} node {hb.node!r}, "
            f"but is stored as cluster {cluster!r} node {node!r}"
        )
    return hb


def decode_epoch(data: bytes, cluster: str, node: str, epoch: str) -> Epoch:
    rec = _decode(Epoch, data)
    if rec.cluster != cluster or rec.node != node or rec.epoch != epoch:
        raise CorruptRecord(
            f"epoch record names {rec.cluster!r}/{rec.node!r}/{rec.epoch!r}, "
            f"but is stored as {cluster!r}/{node!r}/{epoch!r}"
        )
    return rec


def stored_epoch(data: bytes, version: str, cluster: str, node: str,
                 epoch: str) -> Stored[Epoch]:
    try:
        return Stored(version, decode_epoch(data, cluster, node, epoch))
    except NewerFormat as e:
        return Stored(version, None, str(e), newer_format=e.format)
    except CorruptRecord as e:
        return Stored(version, None, str(e))


def stored_lease(data: bytes, version: str, cluster: str, shard: int,
                 size: int | None = None) -> Stored[Lease]:
    """Decode without raising: a corrupt record becomes an entry with an error
    and whatever generation its bytes still show.

    `size` is the record's full size when `data` is only its first bytes (a
    bounded read of a record that may be larger than `MAX_RECORD_BYTES`)."""
    if size is not None and size > MAX_RECORD_BYTES:
        return Stored(version, None, too_big("lease", size), recover_generation(data))
    try:
        return Stored(version, decode_lease(data, cluster, shard))
    except NewerFormat as e:
        return Stored(version, None, str(e), recover_generation(data), e.format)
    except CorruptRecord as e:
        return Stored(version, None, str(e), recover_generation(data))


def too_big(kind: str, size: int) -> str:
    return f"{kind} record is {size} bytes, more than the {MAX_RECORD_BYTES} allowed"


_GENERATION = re.compile(rb'"generation"\s*:\s*(\d{1,19})(?![\d.eE])')


def recover_generation(data: bytes) -> int | None:
    """The generation a corrupt lease record still shows, or None.

    The JSON's `generation` when the bytes are a JSON object; otherwise (cut
    short by a bounded read, or broken elsewhere) the highest `"generation":
    <digits>` found in them. A value read this way only ever raises the next
    claim's generation, never lowers it, so taking the highest is the safe
    reading of an ambiguous record.
    """
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        value = parsed.get("generation")
        if isinstance(value, int) and not isinstance(value, bool) \
                and 0 <= value <= _MAX_GENERATION:
            return value
    found = [int(m) for m in _GENERATION.findall(data[: MAX_RECORD_BYTES + 1])]
    found = [g for g in found if g <= _MAX_GENERATION]
    return max(found) if found else None


def newer_format(parsed: object) -> int | None:
    """The format of a parsed record (a dict) if it is newer than `FORMAT`, else
    None (this version's format, no format, or one that is not a format number:
    validation decides those)."""
    value = parsed.get("format") if isinstance(parsed, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > FORMAT:
        return value
    return None


def _decode(model: type[R], data: bytes) -> R:
    kind = model.__name__.lower()
    if len(data) > MAX_RECORD_BYTES:
        raise CorruptRecord(too_big(kind, len(data)))
    # Validated first (one parse for the records of this version), but a
    # record of a newer format is refused whether it validates or not.
    try:
        record = model.model_validate_json(data)
    except ValidationError as e:
        try:
            newer = newer_format(json.loads(data))
        except (ValueError, RecursionError):
            newer = None
        if newer is not None:
            raise NewerFormat(kind, newer) from None
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        raise CorruptRecord(
            f"invalid {kind} record ({e.error_count()} problem(s)); "
            f"first: {where}: {first['msg']}"
        ) from None
    format = getattr(record, "format", FORMAT)
    if isinstance(format, int) and format > FORMAT:
        raise NewerFormat(kind, format)
    return record
