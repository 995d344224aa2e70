"""kopf's identity for uids without a passwd entry (the image's 65532,
OpenShift's arbitrary uids). The real proof runs in a pod (tests/pods); this
pins the cause: kopf's own default consults the passwd database."""

from __future__ import annotations

import os
import pwd

import pytest
from kopf._core.engines import peering

from shardlease.k8s.login import identity

LOGIN_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME", "POD_ID")


@pytest.fixture
def uid_without_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in LOGIN_VARS:
        monkeypatch.delenv(var, raising=False)

    def getpwuid(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)


@pytest.mark.usefixtures("uid_without_passwd_entry")
def test_kopfs_default_identity_crashes_without_a_passwd_entry() -> None:
    with pytest.raises(KeyError, match="uid not found"):
        peering.detect_own_id(manual=False)


@pytest.mark.usefixtures("uid_without_passwd_entry")
def test_our_identity_needs_no_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    assert identity("db-0") == f"db-0/{os.getpid()}"
    monkeypatch.setenv("POD_NAME", "db-1")
    assert identity() == f"db-1/{os.getpid()}"
    monkeypatch.delenv("POD_NAME")
    assert identity().endswith(f"/{os.getpid()}")
