"""Counting a store's backend requests, from outside the store.

The figures are of backend requests (each HTTP request to S3 or the API
server; each call on the file system or the memory backend), not of
`LeaseStore` calls: the S3 store's listing cache answers a
`list_leases` with no request or with several, and the Kubernetes store
answers reads from its watch. Only the store sees its requests, so it is an
observer: each concrete store reports every request it makes to its
`RequestObservers` (`backend_requests`: S3 from botocore's send hook, every
page and retry; Kubernetes as it sends a request or opens a watch; file and
memory once per call), and a `RequestCounter` attached by `count_requests`
counts them. The `LeaseStore` interface carries none of this, and nothing in
production counts: the benchmark, the simulation's report and the tests do.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Protocol, runtime_checkable

#: Told the kind of each backend request ("list", "get", "put", "delete",
#: "watch", ...) as the store makes it.
RequestObserver = Callable[[str], None]


class RequestObservers:
    """The observers of one store's backend requests."""

    def __init__(self) -> None:
        self._observers: list[RequestObserver] = []

    def add(self, observer: RequestObserver) -> None:
        """Tell `observer` of every request from now on."""
        self._observers.append(observer)

    def report(self, kind: str) -> None:
        """The store made one request of `kind`."""
        for observer in self._observers:
            observer(kind)


@runtime_checkable
class ReportsRequests(Protocol):
    """A store that reports its backend requests (every concrete store)."""

    backend_requests: RequestObservers


class RequestCounter(collections.Counter[str]):
    """Backend requests by kind, from the counter's attachment on."""

    def __call__(self, kind: str) -> None:
        self[kind] += 1


def count_requests(store: object) -> RequestCounter:
    """A new counter of `store`'s backend requests from now on (several may
    count at once, each from its own start)."""
    if not isinstance(store, ReportsRequests):
        raise TypeError(f"{type(store).__name__} does not report its backend requests")
    counter = RequestCounter()
    store.backend_requests.add(counter)
    return counter
