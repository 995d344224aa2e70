"""The S3 listing cache's decision, as tables: when `list_leases` serves its
last listing's answer again, and when a HEAD of the move marker is worth a
request (shardlease.stores.s3.cache). The store's own tests
(tests/stores/test_s3.py) show the same rule on a real S3 server."""

from __future__ import annotations

import pytest

from shardlease.stores.s3.cache import FULL_LIST_EVERY, ViewFacts, head_worth_it, serve_view

STEADY = ViewFacts(has_view=True)

SERVE_CASES = [
    # (facts, marker read since the last call, marker before the view's listing, answer)
    (STEADY, "m1", "m1", "serve"),
    (STEADY, "", "", "serve"),  # no marker object, before and since
    (STEADY, "m2", "m1", "list"),  # somebody marked a move
    (STEADY, "m1", "", "list"),  # the first mark since the listing
    (STEADY, None, "m1", "list"),  # the marker not read since: nothing known
    (STEADY, "m1", None, "list"),  # not read before the listing
    (STEADY, None, None, "list"),
    (ViewFacts(has_view=False), "m1", "m1", "list"),
    (ViewFacts(has_view=True, moving=True), "m1", "m1", "list"),
    (ViewFacts(has_view=True, changed=True), "m1", "m1", "list"),
    (ViewFacts(has_view=True, quiet=False), "m1", "m1", "list"),
    (ViewFacts(has_view=True, marking=True), "m1", "m1", "list"),
    (ViewFacts(has_view=True, wrote=True), "m1", "m1", "list"),
    (ViewFacts(has_view=True, served=FULL_LIST_EVERY - 2), "m1", "m1", "serve"),
    (ViewFacts(has_view=True, served=FULL_LIST_EVERY - 1), "m1", "m1", "list"),
    (ViewFacts(has_view=True, served=FULL_LIST_EVERY + 3), "m1", "m1", "list"),
]


@pytest.mark.parametrize(("facts", "marker", "view_marker", "answer"), SERVE_CASES)
def test_when_the_view_is_served(facts: ViewFacts, marker: str | None,
                                 view_marker: str | None, answer: str) -> None:
    assert serve_view(facts, marker, view_marker) == answer


def test_a_full_listing_every_full_list_every_calls_at_least() -> None:
    """Served answers in a row, from a steady view: at most FULL_LIST_EVERY - 1."""
    served, answers = 0, []
    for _ in range(3 * FULL_LIST_EVERY):
        answer = serve_view(ViewFacts(has_view=True, served=served), "m", "m")
        answers.append(answer)
        served = served + 1 if answer == "serve" else 0
    assert answers.count("list") == 3
    assert answers[:FULL_LIST_EVERY] == ["serve"] * (FULL_LIST_EVERY - 1) + ["list"]


HEAD_CASES = [
    # (facts, HEAD the marker?)
    (ViewFacts(has_view=False), True),  # read it now: the next call compares with it
    (ViewFacts(has_view=True), True),
    (ViewFacts(has_view=True, changed=True), True),  # lists now; the read is for next time
    (ViewFacts(has_view=True, served=FULL_LIST_EVERY), True),
    (ViewFacts(has_view=False, quiet=False), False),  # somebody beats: lists anyway
    (ViewFacts(has_view=True, quiet=False), False),
    (ViewFacts(has_view=True, moving=True), False),  # the view moves: lists anyway
    (ViewFacts(has_view=False, moving=True), True),  # no view to move
]


@pytest.mark.parametrize(("facts", "head"), HEAD_CASES)
def test_when_a_head_of_the_marker_is_worth_a_request(facts: ViewFacts, head: bool) -> None:
    assert head_worth_it(facts) is head


@pytest.mark.parametrize(("facts", "marker", "view_marker", "answer"), SERVE_CASES)
def test_no_view_is_served_on_a_call_that_would_not_read_the_marker(
        facts: ViewFacts, marker: str | None, view_marker: str | None, answer: str) -> None:
    """A call that skips the HEAD (and had no read from the caller) has
    marker None, so it must list: the two rules agree."""
    if not head_worth_it(facts):
        assert serve_view(facts, None, view_marker) == "list"
        assert serve_view(facts, marker, view_marker) == "list"
