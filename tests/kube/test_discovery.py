"""Peers are the Running and Ready pods matching the StatefulSet's selector."""

from shardlease.k8s.discovery import Peers
from shardlease.routing import shard_for_key


def pod(name: str, ready: bool = True, phase: str = "Running", app: str = "db") -> dict:
    return {"metadata": {"name": name, "labels": {"app": app}},
            "status": {"phase": phase, "podIP": f"10.0.0.{name[-1]}",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_only_running_ready_matching_pods_are_peers() -> None:
    peers = Peers({"app": "db"})
    for body in (pod("db-0"), pod("db-1", ready=False), pod("db-2", phase="Pending"),
                 pod("web-3", app="web")):
        peers.observe("ADDED", body)
    assert peers.names() == {"db-0"}
    assert peers.address("db-0") == "10.0.0.0"
    assert peers.address("db-1") is None


def test_a_deleted_pod_stops_being_a_peer_and_a_ready_one_becomes_one() -> None:
    peers = Peers({"app": "db"})
    peers.observe(None, pod("db-0"))
    peers.observe("MODIFIED", pod("db-1", ready=False))
    peers.observe("MODIFIED", pod("db-1"))
    peers.observe("DELETED", pod("db-0"))
    assert peers.names() == {"db-1"}


def test_a_selector_change_applies_to_pods_already_seen() -> None:
    peers = Peers({"app": "db"})
    peers.observe(None, pod("web-0", app="web"))
    assert peers.names() == set()
    peers.selector = {"app": "web"}
    assert peers.names() == {"web-0"}


def test_an_empty_selector_matches_nothing() -> None:
    peers = Peers({})
    peers.observe(None, pod("db-0"))
    assert peers.names() == set()


def test_the_key_hash_is_stable_and_in_range() -> None:
    assert shard_for_key("user-42", 64) == shard_for_key(b"user-42", 64)
    assert shard_for_key("user-42", 64) == 15  # pinned: a contract (tests/test_routing.py)
    assert {shard_for_key(f"k{i}", 8) for i in range(200)} == set(range(8))
