"""Fixtures shared by every test directory.

The real control plane (etcd + kube-apiserver) is defined once here so that
tests/k8s, tests/chart and the others share one instance per session, and so
is the kind cluster of the real-pod tests (tests/pods, tests/kind); each
only starts when a test asks for it.

Also the garbage collector of the pytest process: what collection made
(modules, fixtures, some 1,400 test items in one run) lives until the end,
yet every full collection walked it again. In a warm run at dad338a the four
pytest processes made 103 full collections of over 50 ms (35 s in all, up to
2.6 s each on the loaded machine; nine of them while one run was still
collecting), and a pause that long stops the threads of the process too (a
fault proxy's, a sampler's). So the collector is off while pytest collects,
and what collection left is frozen out of every later collection.

And where the machine's CPU goes, per test: with SHARDLEASE_CPU_LOG set,
each test's CPU seconds (this process's, and those of the processes it
started and reaped, such as node processes) and wall seconds are appended
to that file, for whoever trims the suite next (the warm suite's time is
the CPU of a 2-core machine).
"""

import gc
import os
import resource
import time
from collections.abc import Generator

import pytest

from tests.k8s.fixtures import api_client, controlplane, kube, kubeconfig, namespace
from tests.support.kind import kind, kind_with_image

__all__ = ["api_client", "controlplane", "kind", "kind_with_image", "kube", "kubeconfig",
           "namespace"]


def pytest_configure(config: pytest.Config) -> None:
    gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()
    gc.enable()


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    log = os.environ.get("SHARDLEASE_CPU_LOG")
    if not log:
        yield
        return
    (me, children), began = _cpu(), time.monotonic()
    yield
    (me2, children2), wall = _cpu(), time.monotonic() - began
    with open(log, "a") as out:
        out.write(f"{me2 - me:.2f}\t{children2 - children:.2f}\t{wall:.2f}\t{item.nodeid}\n")
