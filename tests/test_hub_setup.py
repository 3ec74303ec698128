"""make hub's checks before it makes anything, and its login: one password per account."""

import asyncio
from pathlib import Path

import pytest

from autograde_tests.hub import Hub
from autograde_tests.hub.accounts import HubError, PasswordPerAccount

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
