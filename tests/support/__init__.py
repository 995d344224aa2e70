"""Helpers shared by the tests: servers on loopback and their fixtures."""

import pytest

# Fixture modules here are loaded as plugins
# (`pytest_plugins = ["tests.support.s3server"]`) and also imported for their
# helpers: have pytest rewrite their asserts before either happens.
pytest.register_assert_rewrite(f"{__name__}.s3server", f"{__name__}.faultproxy")
