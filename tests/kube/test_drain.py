"""Who may drain, and whether a drain is the pod's end or a pause."""

from shardlease.k8s.drain import restart_counts, restarted, terminating, token_accepted


def pod(deleting: bool = False, app_restarts: int = 0, app_state: str = "running") -> dict:
    meta: dict = {"name": "db-0"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T15:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [
        {"name": "app", "restartCount": app_restarts, "state": {app_state: {}}},
        {"name": "shardlease-agent", "restartCount": 7, "state": {"running": {}}},
    ]}}


def test_a_drain_needs_the_pods_token() -> None:
    assert token_accepted("s3cret", "s3cret")
    assert not token_accepted("s3cret", "guess")
    assert not token_accepted("s3cret", None)
    assert not token_accepted(None, "anything")  # an agent without a token drains on SIGTERM only
    assert not token_accepted("", "")


def test_a_pod_with_a_deletion_timestamp_is_terminating() -> None:
    assert terminating(pod(deleting=True))
    assert not terminating(pod())
    assert not terminating(None)


def test_a_pause_ends_when_an_application_container_restarted_and_runs() -> None:
    before = restart_counts(pod(app_restarts=2), skip="shardlease-agent")
    assert before == {"app": 2}
    assert not restarted(before, pod(app_restarts=2), "shardlease-agent")
    assert not restarted(before, pod(app_restarts=3, app_state="waiting"), "shardlease-agent")
    assert restarted(before, pod(app_restarts=3), "shardlease-agent")
    assert not restarted(before, None, "shardlease-agent")
