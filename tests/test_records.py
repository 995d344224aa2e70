"""The record format rule: a record of a format newer than `records.FORMAT` is
never read as a record of this version, whatever it holds; format 1 and a
missing format read as before; a format that is no format number is corrupt."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shardlease.errors import CorruptRecord
from shardlease.records import (
    FORMAT,
    MAX_KEEPS_SHARD,
    MAX_LEASE_TTL,
    Epoch,
    Heartbeat,
    Lease,
    NewerFormat,
    decode_epoch,
    decode_heartbeat,
    decode_lease,
    decode_shards,
    encode,
    encode_shards,
    stored_epoch,
    stored_lease,
)

CLUSTER = "records"


def lease_json(**changes: Any) -> dict[str, Any]:
    lease = Lease(cluster=CLUSTER, shard=3, owner="node-a", generation=41,
                  incarnation="inc-1", write_id="w1", renewed_at=1000.0, ttl=15.0)
    return {**json.loads(encode(lease)), **changes}


def epoch_json(**changes: Any) -> dict[str, Any]:
    epoch = Epoch(cluster=CLUSTER, node="node-a", epoch="e1", seq=4, write_id="w1", ttl=15.0)
    return {**json.loads(encode(epoch)), **changes}


def heartbeat_json(**changes: Any) -> dict[str, Any]:
    hb = Heartbeat(cluster=CLUSTER, node="node-a", incarnation="inc-1", seq=4, write_id="w1")
    return {**json.loads(encode(hb)), **changes}


def raw(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


def test_this_version_writes_format_1() -> None:
    assert FORMAT == 1
    assert lease_json()["format"] == 1 and epoch_json()["format"] == 1
    assert heartbeat_json()["format"] == 1


# A newer format may change anything: extra fields, fields this version
# requires gone or retyped. Valid or not to this version, it is not read.
NEWER_LEASES = {
    "valid to this version": lease_json(format=2),
    "unknown fields": lease_json(format=2, holders=["a", "b"], quorum={"n": 3}),
    "a field retyped": lease_json(format=2, ttl="15s", owner={"name": "node-a"}),
    "a required field gone": {k: v for k, v in lease_json(format=2).items()
                              if k != "write_id"},
}


@pytest.mark.parametrize("record", NEWER_LEASES.values(), ids=NEWER_LEASES)
def test_a_lease_of_a_newer_format_is_not_read_but_keeps_its_generation(
        record: dict[str, Any]) -> None:
    got = stored_lease(raw(record), "v1", CLUSTER, 3)
    assert got.record is None and got.newer_format == 2
    assert got.error and "format 2" in got.error and "newer" in got.error
    assert got.recovered_generation == 41 and got.generation == 41
    assert got.version == "v1"
    with pytest.raises(NewerFormat) as raised:
        decode_lease(raw(record), CLUSTER, 3)
    assert raised.value.format == 2
    assert isinstance(raised.value, CorruptRecord)


def test_a_newer_lease_stored_under_another_shard_is_still_newer_not_misplaced() -> None:
    # Where it is stored may also mean something else in a newer format.
    got = stored_lease(raw(lease_json(format=7)), "v1", CLUSTER, 4)
    assert got.record is None and got.newer_format == 7 and got.generation == 41


@pytest.mark.parametrize("record", [
    epoch_json(format=2, extra={"x": 1}),
    {k: v for k, v in epoch_json(format=2).items() if k != "seq"},
], ids=["unknown fields", "a required field gone"])
def test_an_epoch_of_a_newer_format_is_not_read(record: dict[str, Any]) -> None:
    got = stored_epoch(raw(record), "v1", CLUSTER, "node-a", "e1")
    assert got.record is None and got.newer_format == 2
    assert got.error and "format 2" in got.error
    with pytest.raises(NewerFormat):
        decode_epoch(raw(record), CLUSTER, "node-a", "e1")


def test_a_heartbeat_of_a_newer_format_is_not_read() -> None:
    for record in (heartbeat_json(format=2, extra=[1, 2]),
                   {k: v for k, v in heartbeat_json(format=2).items() if k != "incarnation"}):
        with pytest.raises(NewerFormat) as raised:
            decode_heartbeat(raw(record), CLUSTER, "node-a")
        assert raised.value.format == 2 and "format 2" in str(raised.value)


@pytest.mark.parametrize("has_format", [True, False], ids=["format 1", "no format"])
def test_format_1_and_a_missing_format_read_as_before(has_format: bool) -> None:
    lease, epoch, hb = lease_json(), epoch_json(), heartbeat_json()
    if not has_format:
        for record in (lease, epoch, hb):
            del record["format"]
    got = stored_lease(raw(lease), "v1", CLUSTER, 3)
    assert got.record is not None and got.record.format == 1 and got.record.generation == 41
    assert got.newer_format is None and got.error is None
    got_epoch = stored_epoch(raw(epoch), "v1", CLUSTER, "node-a", "e1")
    assert got_epoch.record is not None and got_epoch.record.format == 1
    assert got_epoch.newer_format is None
    assert decode_heartbeat(raw(hb), CLUSTER, "node-a").format == 1


def test_a_heartbeat_older_than_holds_by_reads_as_holding_by_0() -> None:
    # `holds_by` was added within format 1 (optional, like `hold` and `keeps`
    # before it): a heartbeat without it holds no lease by any TTL we know;
    # one of a version that knows it reads as written; out of range, corrupt.
    old = {k: v for k, v in heartbeat_json().items() if k != "holds_by"}
    assert decode_heartbeat(raw(old), CLUSTER, "node-a").holds_by == 0.0
    assert decode_heartbeat(raw(heartbeat_json(holds_by=30.0)), CLUSTER,
                            "node-a").holds_by == 30.0
    for bad in (-1.0, MAX_LEASE_TTL + 1, "x"):
        with pytest.raises(CorruptRecord):
            decode_heartbeat(raw(heartbeat_json(holds_by=bad)), CLUSTER, "node-a")


BAD_FORMATS = ["x", "2", 0, -1, 2.0, 1.5, True, None, [2], {"v": 2}]


@pytest.mark.parametrize("format", BAD_FORMATS, ids=map(repr, BAD_FORMATS))
def test_a_format_that_is_no_format_number_is_corrupt(format: object) -> None:
    got = stored_lease(raw(lease_json(format=format)), "v1", CLUSTER, 3)
    assert got.record is None and got.newer_format is None
    assert got.error and "format" in got.error
    assert got.generation == 41  # as for any corrupt lease
    got_epoch = stored_epoch(raw(epoch_json(format=format)), "v1", CLUSTER, "node-a", "e1")
    assert got_epoch.record is None and got_epoch.newer_format is None
    for decode in (lambda: decode_lease(raw(lease_json(format=format)), CLUSTER, 3),
                   lambda: decode_heartbeat(raw(heartbeat_json(format=format)), CLUSTER,
                                            "node-a")):
        with pytest.raises(CorruptRecord) as raised:
            decode()
        assert not isinstance(raised.value, NewerFormat)


def test_an_oversize_record_is_corrupt_whatever_its_format() -> None:
    record = lease_json(format=2, padding="x" * 5000)
    got = stored_lease(raw(record), "v1", CLUSTER, 3)
    assert got.record is None and got.newer_format is None and got.error
    assert "bytes" in got.error and got.generation == 41


# -- the Kubernetes codec: the format as an annotation --------------------------------


def test_a_kubernetes_lease_object_of_format_1_has_no_format_annotation() -> None:
    from shardlease.stores.kubernetes import ANN_FORMAT, lease_to_object, object_to_lease

    lease = Lease.model_validate(lease_json())
    obj = lease_to_object(lease, "ns", "7", 1000.0)
    assert ANN_FORMAT not in obj["metadata"]["annotations"]
    got = object_to_lease(obj, CLUSTER, 3)
    assert got.record == lease and got.newer_format is None


@pytest.mark.parametrize("annotation, newer", [("2", 2), ("17", 17)])
def test_a_kubernetes_lease_object_of_a_newer_format_is_not_read(
        annotation: str, newer: int) -> None:
    from shardlease.stores.kubernetes import ANN_FORMAT, lease_to_object, object_to_lease

    obj = lease_to_object(Lease.model_validate(lease_json()), "ns", "7", 1000.0)
    obj["metadata"]["annotations"][ANN_FORMAT] = annotation
    del obj["metadata"]["annotations"]["shardlease.io/write-id"]  # may change anything
    got = object_to_lease(obj, CLUSTER, 3)
    assert got.record is None and got.newer_format == newer and got.generation == 41
    assert got.error and f"format {newer}" in got.error
    # And a record of format 2 written through the codec reads back as newer.
    written = lease_to_object(Lease.model_validate(lease_json(format=2)), "ns", "7", 1000.0)
    assert written["metadata"]["annotations"][ANN_FORMAT] == "2"
    assert object_to_lease(written, CLUSTER, 3).newer_format == 2


@pytest.mark.parametrize("annotation", ["x", "0", "-1", "02", " 2", "2.0", ""])
def test_a_kubernetes_format_annotation_that_is_no_format_number_is_corrupt(
        annotation: str) -> None:
    from shardlease.stores.kubernetes import ANN_FORMAT, lease_to_object, object_to_lease

    obj = lease_to_object(Lease.model_validate(lease_json()), "ns", "7", 1000.0)
    obj["metadata"]["annotations"][ANN_FORMAT] = annotation
    got = object_to_lease(obj, CLUSTER, 3)
    assert got.record is None and got.newer_format is None and got.error
    assert got.generation == 41


def test_a_kubernetes_heartbeat_object_reads_back_with_what_its_node_holds_by() -> None:
    from shardlease.stores.kubernetes import (
        ANN_FORMAT,
        ANN_HOLDS_BY,
        heartbeat_to_object,
        object_to_heartbeat,
    )

    hb = Heartbeat.model_validate(heartbeat_json(holds_by=30.0, at=1000.25, seq=0))
    obj = heartbeat_to_object(hb, "ns")
    assert object_to_heartbeat(obj, CLUSTER, "node-a") == hb
    del obj["metadata"]["annotations"][ANN_HOLDS_BY]  # written before the field
    assert object_to_heartbeat(obj, CLUSTER, "node-a").holds_by == 0.0
    with pytest.raises(CorruptRecord):  # another node's
        object_to_heartbeat(obj, CLUSTER, "node-b")
    obj["metadata"]["annotations"][ANN_HOLDS_BY] = "-1"
    with pytest.raises(CorruptRecord):
        object_to_heartbeat(obj, CLUSTER, "node-a")
    obj["metadata"]["annotations"][ANN_FORMAT] = "2"
    with pytest.raises(NewerFormat):
        object_to_heartbeat(obj, CLUSTER, "node-a")


# -- what an epoch keeps ----------------------------------------------------------------


@pytest.mark.parametrize("shards", [
    [], [0], [7], [8], [3, 9, 64], list(range(100)), list(range(0, 8192, 3)),
    [MAX_KEEPS_SHARD], list(range(MAX_KEEPS_SHARD + 1)),
], ids=["none", "shard 0", "the last of a byte", "the first of the next", "scattered",
        "a run", "every third of 8192", "the highest", "all 8192"])
def test_a_shard_set_round_trips_as_a_bitmap(shards: list[int]) -> None:
    text = encode_shards(shards)
    assert text is not None and decode_shards(text) == frozenset(shards)
    assert len(text) <= 1368
    Epoch.model_validate(epoch_json(keeps=text))  # (a valid field)


def test_a_shard_above_the_bitmap_says_nothing_rather_than_part() -> None:
    # None: "every shard may be kept" (peers wait for the epoch), never a subset.
    assert encode_shards([1, MAX_KEEPS_SHARD + 1]) is None


@pytest.mark.parametrize("keeps", ["not base64!", "A" * 1369, "=AAA"])
def test_an_epoch_whose_keeps_is_no_bitmap_is_corrupt(keeps: str) -> None:
    with pytest.raises(CorruptRecord):
        decode_epoch(raw(epoch_json(keeps=keeps)), CLUSTER, "node-a", "e1")


def test_an_epoch_without_keeps_says_nothing() -> None:
    record = epoch_json()
    del record["keeps"]
    assert decode_epoch(raw(record), CLUSTER, "node-a", "e1").keeps is None
