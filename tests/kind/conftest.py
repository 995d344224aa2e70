"""The kind cluster's tests share its fixtures with tests/pods
(tests/support/kind.py, registered in tests/conftest.py)."""

from tests.support.kind import ROOT, Kind, kindmod

__all__ = ["ROOT", "Kind", "kindmod"]
