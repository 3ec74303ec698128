"""make hub's checks before it makes anything, and its login: one password per account."""

import asyncio
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from autograde_tests.hub import local_hub
from autograde_tests.hub.accounts import HubError, PasswordPerAccount
from autograde_tests.hub.local_hub import Hub

UNUSED = Path("no-proxy-needed")


@pytest.mark.parametrize("names, message", [
    (("Ada Lovelace", ("bob",)), "is not an account name"),
    (("teach", ("teach",)), "distinct account names"),
    (("root", ("bob",)), "already exists on this machine"),
])
def test_bad_account_names_get_one_line_and_nothing_is_made(names, message):
    instructor, learners = names
    hub = Hub(UNUSED, instructor, learners)
    with pytest.raises(HubError, match=message):
        hub.__enter__()
    assert hub.root is None


def log_in(name: str, password: str) -> str | None:
    authenticator = PasswordPerAccount(passwords={"ada": "ada-secret", "bob": "bob-secret"})
    return asyncio.run(authenticator.authenticate(None, {"username": name, "password": password}))


def test_each_account_logs_in_with_its_own_password_only():
    assert log_in("ada", "ada-secret") == "ada"
    assert log_in("ada", "bob-secret") is None
    assert log_in("bob", "") is None
    assert log_in("eve", "ada-secret") is None


def test_a_repository_in_a_private_folder_is_opened_to_the_accounts_and_closed_after(tmp_path, monkeypatch):
    """The instructor runs `make -C <repository> grade`: make reads the folder to find its Makefile."""
    private, repo = tmp_path / "private", tmp_path / "private" / "course"
    repo.mkdir(parents=True)
    (repo / "Makefile").write_text("grade:\n\t@echo graded\n")
    repo.chmod(0o700)
    private.chmod(0o700)
    monkeypatch.setattr(local_hub, "REPO", repo)
    hub = Hub(UNUSED)
    hub._let_accounts_reach_the_environment()
    try:
        assert stat.S_IMODE(repo.stat().st_mode) == 0o705
        assert stat.S_IMODE(private.stat().st_mode) == 0o701  # passed through, not listed
        if os.geteuid() == 0 and shutil.which("setpriv"):
            run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                  "make", "-s", "-C", str(repo), "grade"], capture_output=True, text=True)
            assert run.stdout.strip() == "graded", run.stderr
    finally:
        hub.__exit__()
    assert stat.S_IMODE(repo.stat().st_mode) == 0o700
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
