"""The control plane fixtures live in tests/k8s/fixtures.py and are registered
once for the whole suite by tests/conftest.py, so every directory shares one
control plane per session."""

from tests.k8s.fixtures import cpmod

__all__ = ["cpmod"]
