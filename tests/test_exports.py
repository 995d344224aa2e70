"""`import shardlease` gives a library user every entry point by name, and
every error it exports is caught by one `except ShardleaseError`."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import shardlease
from shardlease import errors, telemetry
from shardlease.errors import ShardleaseError

EXPECTED = {
    # the engine and its options
    "PlacementLoop", "Options",
    # the application side
    "Host", "LeasedHost", "Validity", "HttpHost",
    # the stores
    "LeaseStore", "open_store",
    # the records
    "Lease", "Epoch", "Heartbeat",
    # telemetry and its events
    "Telemetry", "Event", "Claim", "Release", "Lost", "SelfFence", "RenewFailed",
    "RenewSlow", "Overrun", "LeftToExpire", "EpochEnded", "ExtendFailed", "Opened", "DeadlineMoved",
    "Closed", "CorruptLease", "NewerRecord", "Round", "Joined",
    # the errors (shardlease.errors)
    "ShardleaseError", "ConfigError", "StoreError", "StoreUnsafe", "Conflict",
    "CorruptRecord", "HostError", "OutdatedGeneration", "EngineError", "RunnerDied", "LoopDied",
    "PluginError", "DemoError", "KubeAPIError",
}

EXPORTED_ERRORS = [name for name in shardlease.__all__
                   if isinstance(getattr(shardlease, name), type)
                   and issubclass(getattr(shardlease, name), BaseException)]


def test_the_package_exports_exactly_the_expected_names_sorted() -> None:
    assert set(shardlease.__all__) == EXPECTED
    assert len(shardlease.__all__) == len(EXPECTED), "a name exported twice"
    assert shardlease.__all__ == sorted(shardlease.__all__)


def test_every_exported_name_imports() -> None:
    namespace: dict[str, object] = {}
    exec("from shardlease import *", namespace)
    assert EXPECTED <= set(namespace)
    for name in shardlease.__all__:
        assert getattr(shardlease, name) is namespace[name]


@pytest.mark.parametrize("name", EXPORTED_ERRORS)
def test_every_exported_exception_is_a_shardlease_error(name: str) -> None:
    assert issubclass(getattr(shardlease, name), ShardleaseError)


def _defined_in(module: object, base: type) -> set[str]:
    return {name for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, base)
            and value.__module__ == getattr(module, "__name__", None)}


def test_every_error_class_in_errors_py_is_exported() -> None:
    assert _defined_in(errors, BaseException) <= set(shardlease.__all__)


def test_every_telemetry_event_class_is_exported() -> None:
    events = _defined_in(telemetry, telemetry.Event)
    assert all(dataclasses.is_dataclass(getattr(telemetry, e)) for e in events)
    assert events <= set(shardlease.__all__)


# Exception classes that are not ShardleaseErrors, on purpose: each a private
# signal caught inside its own module (never raised to a caller), or the
# simulator's own failure (a test tool, not the library).
NOT_SHARDLEASE_ERRORS = {
    "shardlease.runner._Expired",
    "shardlease.stores.kubernetes.informer._Expired",
    "shardlease.sim.vloop.SimulationStuck",
}


MODULES = sorted(info.name for info in pkgutil.walk_packages(shardlease.__path__, "shardlease.")
                 if info.name != "shardlease.__main__")  # (that one runs the CLI)


def test_every_exception_class_in_the_package_derives_from_the_one_base() -> None:
    strays = sorted(
        f"{module}.{name}" for module in MODULES
        for name in _defined_in(importlib.import_module(module), BaseException)
        if not issubclass(getattr(importlib.import_module(module), name), ShardleaseError))
    assert set(strays) == NOT_SHARDLEASE_ERRORS, \
        "an exception class outside the hierarchy of shardlease.errors (or one listed here " \
        "is gone)"


@pytest.mark.parametrize("old_home, name", [
    ("shardlease.k8s.agent", "LoopDied"),
    ("shardlease.k8s.plugin", "PluginError"),
    ("shardlease.demo", "DemoError"),
])
def test_an_error_moved_to_errors_py_still_imports_from_its_old_home(
        old_home: str, name: str) -> None:
    assert getattr(importlib.import_module(old_home), name) is getattr(errors, name)
