"""The hub's accounts: system users made for one run of the hub and removed after it, each with its own
password (a shared password would let any learner log in as any other)."""

import os
import pwd
import secrets
import subprocess
from pathlib import Path

import psutil
from jupyterhub.auth import Authenticator
from traitlets import Dict


class HubError(Exception):
    """A reason the hub cannot start, in one line."""


class PasswordPerAccount(Authenticator):
    """Logs in exactly the configured accounts, each with its own password."""

    passwords = Dict(config=True, help="account name -> password")

    async def authenticate(self, handler, data):
        expected = self.passwords.get(data["username"])
        given = data.get("password", "")
        if expected and secrets.compare_digest(expected.encode(), given.encode()):
            return data["username"]
        return None


def new_password() -> str:
    return secrets.token_urlsafe(9)


def exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def refuse_taken(name: str) -> None:
    """The hub makes its accounts and removes them after: it never takes over an existing user."""
    if exists(name):
        raise HubError(f"a user named {name!r} already exists on this machine: choose other account names")


def add(name: str, home: Path) -> None:
    """A system user ``name`` with its own group and a home only it can open."""
    subprocess.run(["useradd", "--home-dir", str(home), "--create-home", "--user-group",
                    "--shell", "/bin/bash", name], check=True, capture_output=True)
    home.chmod(0o700)


def give(name: str, path: Path) -> None:
    """Make ``name`` own ``path`` and everything under it."""
    entry = pwd.getpwnam(name)
    for folder, dirs, files in os.walk(path):
        for item in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.lchown(item, entry.pw_uid, entry.pw_gid)


def remove(name: str) -> None:
    """End every process of ``name`` (servers, kernels, terminals), then the user and its home."""
    if not exists(name):
        return
    uid = pwd.getpwnam(name).pw_uid
    for attempt in range(20):
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        if not left:
            break
        for process in left:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=5)
    else:
        raise HubError(f"processes of {name!r} would not end")
    subprocess.run(["userdel", "--remove", name], check=True, capture_output=True)
