"""The fault-injecting S3 proxy (`shardlease_tools.faultproxy`) as test fixtures.

Use from a test module with::

    pytest_plugins = ["tests.support.s3server", "tests.support.faultproxy"]

- `fault_proxy` (function): a factory, ``fault_proxy(upstream_endpoint)``,
  returning a started `ProxyThread` (the proxy in a thread of its own, so
  that sync tests driving node processes can change its faults at run time
  with ``proxy.set(Faults(...))`` and read ``proxy.counts()``). One proxy per
  node targets that node alone. Every proxy made is stopped after the test.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from shardlease_tools.faultproxy import Faults, ProxyThread

__all__ = ["Faults", "MakeProxy", "ProxyThread", "fault_proxy"]

MakeProxy = Callable[..., ProxyThread]


@pytest.fixture
def fault_proxy() -> Iterator[MakeProxy]:
    # The proxy's thread stops whenever this process collects its garbage,
    # and a full collection of a pytest process that ran a hundred tests
    # before took up to 1.3 s here: longer than the slack of a renewal at a
    # 3 s TTL. Frozen, what earlier tests left is not walked again.
    gc.collect()
    gc.freeze()
    try:
        with ExitStack() as stack:

            def make(upstream: str, *, seed: int | None = 0) -> ProxyThread:
                return stack.enter_context(ProxyThread(upstream, seed=seed))

            yield make
    finally:
        gc.unfreeze()
