"""What a drain comes to (final, a pause, refused), from the API server's
view alone: the request itself is never trusted."""

from __future__ import annotations

from typing import Any

import pytest

from shardlease.k8s.drain import (
    drain_containers,
    event_time,
    restart_counts,
    restarted,
    stop_announced,
    terminating,
    verdict,
)

PORT = 8470
HOOK = {"preStop": {"httpGet": {"path": "/drain", "port": PORT}}}
STARTED = "2026-12-02T10:00:00Z"


def pod(deleting: bool = False, app_restarts: int = 0, app_state: str = "running",
        started: str = STARTED, uid: str = "u-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "db-0", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T15:00:00Z"
    state = {app_state: {"startedAt": started} if app_state == "running" else {}}
    return {"metadata": meta,
            "spec": {"containers": [
                {"name": "app", "lifecycle": HOOK},
                {"name": "worker", "lifecycle": HOOK},
                {"name": "istio-proxy"},  # no drain hook
                {"name": "own-hook", "lifecycle": {"preStop": {"exec": {"command": ["x"]}}}}]},
            "status": {"containerStatuses": [
                {"name": "app", "restartCount": app_restarts, "state": state},
                {"name": "worker", "restartCount": 0,
                 "state": {"running": {"startedAt": STARTED}}},
                {"name": "istio-proxy", "restartCount": 0,
                 "state": {"running": {"startedAt": STARTED}}},
                {"name": "own-hook", "restartCount": 0,
                 "state": {"running": {"startedAt": STARTED}}},
                {"name": "shardlease-agent", "restartCount": 7, "state": {"running": {}}}]}}


def killing(container: str = "app", at: str = "2026-12-02T10:05:00Z", *, name: str = "db-0",
            uid: str = "u-1", reason: str = "Killing", kind: str = "Pod",
            field: str | None = None, stamp: str = "lastTimestamp") -> dict[str, Any]:
    """An Event as the kubelet records it before it runs a preStop hook."""
    return {"reason": reason, stamp: at, "involvedObject": {
        "kind": kind, "name": name, "uid": uid,
        "fieldPath": field if field is not None else f"spec.containers{{{container}}}"}}


def test_a_pod_with_a_deletion_timestamp_is_terminating() -> None:
    assert terminating(pod(deleting=True))
    assert not terminating(pod())
    assert not terminating(None)


def test_the_drain_containers_are_those_whose_prestop_is_this_agents_drain() -> None:
    assert drain_containers(pod(), PORT) == {"app", "worker"}
    assert drain_containers(pod(), 9999) == set()
    assert drain_containers(None, PORT) == set()


def test_an_events_time_is_its_latest_stamp() -> None:
    assert event_time({"lastTimestamp": "2026-12-02T10:05:00Z"}).isoformat() \
        == "2026-12-02T10:05:00+00:00"  # type: ignore[union-attr]
    assert event_time({"firstTimestamp": "2026-12-02T10:00:00Z",
                       "series": {"lastObservedTime": "2026-12-02T10:07:00.123456Z"}}
                      ).minute == 7  # type: ignore[union-attr]
    assert event_time({"eventTime": "garbage"}) is None
    assert event_time({}) is None


@pytest.mark.parametrize(("events", "expected"), [
    ([killing()], "app"),
    ([killing("worker")], "worker"),
    ([killing(at=STARTED)], "app"),                                  # the very second it started
    ([killing(at="2026-12-02T09:59:59Z")], None),                    # the previous instance's
    ([killing(stamp="eventTime", at="2026-12-02T10:05:00.5Z")], "app"),
    ([killing("istio-proxy")], None),                                # no drain hook
    ([killing("own-hook")], None),                                   # a hook of its own
    ([killing("shardlease-agent")], None),
    ([killing(reason="Unhealthy")], None),
    ([killing(reason="Started")], None),
    ([killing(name="db-1")], None),                                  # another pod's
    ([killing(uid="u-0")], None),                                    # an earlier pod of the name
    ([killing(kind="StatefulSet")], None),
    ([killing(field="")], None),                                     # the pod, not a container
    ([killing(field="spec.initContainers{app}")], None),
    ([killing("ghost")], None),                                      # no such container
    ([{"reason": "Killing"}], None),                                 # malformed
    ([], None),
    ([killing(reason="Unhealthy"), killing("worker")], "worker"),
])
def test_a_stop_counts_only_when_the_kubelet_announced_it_for_a_hooked_running_container(
        events: list[dict[str, Any]], expected: str | None) -> None:
    assert stop_announced(pod(), events, PORT) == expected


def test_a_container_that_is_not_running_has_no_announced_stop() -> None:
    assert stop_announced(pod(app_state="waiting"), [killing()], PORT) is None
    assert stop_announced(pod(started="not a time"), [killing()], PORT) is None


@pytest.mark.parametrize(("the_pod", "events", "expected"), [
    (pod(deleting=True), [], "final"),
    (pod(deleting=True), [killing()], "final"),   # deletion wins: the pod's end
    (pod(), [killing()], "pause"),
    (pod(), [], "refuse"),
    (pod(), [killing(at="2026-12-01T00:00:00Z")], "refuse"),
    (None, [killing()], "refuse"),                # the API server could not say
])
def test_a_drain_is_final_a_pause_or_refused(the_pod: dict[str, Any] | None,
                                             events: list[dict[str, Any]],
                                             expected: str) -> None:
    kind, why = verdict(the_pod, events, PORT)
    assert kind == expected
    assert why


def test_a_pause_ends_when_an_application_container_restarted_and_runs() -> None:
    before = restart_counts(pod(app_restarts=2), skip="shardlease-agent")
    assert before == {"app": 2, "worker": 0, "istio-proxy": 0, "own-hook": 0}
    assert not restarted(before, pod(app_restarts=2), "shardlease-agent")
    assert not restarted(before, pod(app_restarts=3, app_state="waiting"), "shardlease-agent")
    assert restarted(before, pod(app_restarts=3), "shardlease-agent")
    assert not restarted(before, None, "shardlease-agent")
