"""The real porcupine-check binary, built once through the project's build
script (e2e/controlplane build porcupine-check) and cached under
~/.cache/shardlease; $SHARDLEASE_PORCUPINE_CHECK overrides it, as for a user."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlease_tools.verify import CheckerError, find_checker


@pytest.fixture(scope="session")
def checker() -> Path:
    try:
        return find_checker()
    except CheckerError as e:
        pytest.fail(f"cannot build the checker: {e}", pytrace=False)
