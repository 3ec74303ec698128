"""The course on a local JupyterHub (``make hub``): an instructor and learners as system users, nbgrader's
exchange in a folder of its own, the course's environment as every user's server and kernel.

``Hub`` is a context manager: it makes the accounts and folders, starts JupyterHub (which starts the proxy
and, on login, each user's JupyterLab), and on exit stops every process, removes the accounts and their
folders, and puts back the folder modes it changed. The test drives the same ``Hub`` in a browser.
"""

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import autograde_tests

from .. import nbgrader_course, scratch_course
from . import accounts
from .accounts import HubError

COURSE_ID = "attention-step-by-step"
REPO = Path(autograde_tests.__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# What useradd accepts by default, and what JupyterHub keeps as typed (it lower-cases login names).
ACCOUNT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
# Held while a hub has folder modes changed: a second hub on the machine (another `make hub`, or a test
# run beside this one) waits for it, so that neither puts back a mode the other still relies on.
MODES_LOCK = Path(tempfile.gettempdir()) / f"{COURSE_ID}-hub-modes.lock"


@dataclass
class Hub:
    """A JupyterHub on ``127.0.0.1:port`` for ``instructor`` and ``learners``, all made under ``root``."""

    proxy: Path
    instructor: str = "instructor"
    learners: tuple[str, ...] = ("learner1", "learner2")
    port: int = 8000
    root: Path | None = field(default=None, init=False)
    passwords: dict[str, str] = field(default_factory=dict, init=False)
    _made: list[str] = field(default_factory=list, init=False)
    _modes: dict[Path, int] = field(default_factory=dict, init=False)
    _modes_lock: object | None = field(default=None, init=False)
    _process: subprocess.Popen | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def home(self, name: str) -> Path:
        return self.root / "home" / name

    @property
    def course(self) -> Path:
        """The instructor's course folder, which is the instructor's home: nbgrader works from there."""
        return self.home(self.instructor)

    @property
    def exchange(self) -> Path:
        return self.root / "exchange"

    def server_env(self) -> dict[str, str]:
        """What every user's server, kernels and terminals get (JupyterHub adds HOME and USER)."""
        return {
            "PATH": os.pathsep.join([str(VENV_BIN), "/usr/local/bin", "/usr/bin", "/bin"]),
            # The exchange's place and the course id, for every account (see _configure_nbgrader).
            "JUPYTER_CONFIG_PATH": str(self.root / "jupyter"),
        }

    def __enter__(self) -> "Hub":
        self._check()
        self.root = Path(tempfile.mkdtemp(prefix="attention-hub-"))
        try:
            self._prepare()
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop()
        for name in reversed(self._made):
            accounts.remove(name)
        self._made.clear()
        for path, mode in self._modes.items():
            path.chmod(mode)
        self._modes.clear()
        if self._modes_lock is not None:
            self._modes_lock.close()  # releases the lock
            self._modes_lock = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _check(self) -> None:
        names = [self.instructor, *self.learners]
        if len(set(names)) != len(names):
            raise HubError("the instructor and the learners need distinct account names")
        for name in names:
            if not ACCOUNT_NAME.fullmatch(name):
                raise HubError(f"{name!r} is not an account name: lower-case letters, digits, _ and -, "
                               "starting with a letter, at most 32 characters")
            accounts.refuse_taken(name)
        if os.geteuid() != 0:
            raise HubError("make hub creates the course's accounts as system users: run it as root")
        if not os.access(self.proxy, os.X_OK):
            raise HubError(f"no proxy at {self.proxy}: run `make proxy` (it needs npm)")

    def _prepare(self) -> None:
        self.root.chmod(0o755)
        self._let_accounts_reach_the_environment()
        # The repository's own solutions/ sits beside the course package the kernels import.
        self._set_mode(REPO / "solutions", 0o700)
        (self.root / "home").mkdir(mode=0o755)
        for name in [self.instructor, *self.learners]:
            accounts.add(name, self.home(name))
            self._made.append(name)
            self.passwords[name] = accounts.new_password()
        self._fill_course()
        # The exchange: nbgrader's release makes it world-writable (0777) and guards each course's
        # inbound (0733: learners drop submissions but cannot list them) and feedback (0711) itself.
        self.exchange.mkdir(mode=0o777)
        self.exchange.chmod(0o777)
        self._configure_nbgrader()

    def _let_accounts_reach_the_environment(self) -> None:
        """Let every account pass through (not list) the folders above the interpreter and the course's
        environment, which may lie in a private home folder, and list the repository itself: the
        instructor's `make -C <repository> grade` finds the Makefile by reading the folder. Put back on exit."""
        self._modes_lock = open(MODES_LOCK, "a")
        fcntl.flock(self._modes_lock, fcntl.LOCK_EX)
        for target in [Path(sys.base_prefix).resolve(), VENV_BIN.resolve(), REPO]:
            for folder in [target, *target.parents]:
                needed = stat.S_IXOTH | (stat.S_IROTH if folder == REPO else 0)
                mode = stat.S_IMODE(folder.stat().st_mode)
                if mode & needed != needed:
                    self._set_mode(folder, mode | needed)

    def _set_mode(self, path: Path, mode: int) -> None:
        self._modes.setdefault(path, stat.S_IMODE(path.stat().st_mode))
        path.chmod(mode)

    def _fill_course(self) -> None:
        """The course's configuration and instructor notebooks, and the release and gradebook that
        `make release` would make there (`make grade` grades only chapters in the gradebook)."""
        scratch_course.scratch_course(REPO, self.course)
        for chapter in nbgrader_course.chapters(self.course):
            scratch_course.release(self.course, chapter)
        # The instructor's JupyterLab shows nbgrader's instructor parts (formgrader, Create Assignment).
        shutil.copytree(REPO / "jupyter" / "instructor", self.course / ".jupyter", dirs_exist_ok=True)
        accounts.give(self.instructor, self.course)

    def _configure_nbgrader(self) -> None:
        folder = self.root / "jupyter"
        folder.mkdir(mode=0o755)
        (folder / "nbgrader_config.py").write_text(
            "c = get_config()  # noqa: F821\n"
            f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
            f"c.Exchange.root = {str(self.exchange)!r}\n"
            # The instructor's `nbgrader collect` never follows a link a learner planted in inbound/.
            'c.ExchangeFactory.collect = "autograde_tests.exchange.SafeCollect"\n'
        )
        # Terminals run a plain shell: a login shell would reset PATH (/etc/profile) and lose the
        # course's environment, nbgrader and make grade's Python with it.
        (folder / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"terminado_settings": {"shell_command": ["/bin/bash"]}}}))

    def _hub_config(self, state: Path) -> dict:
        return {
            "JupyterHub": {
                "bind_url": self.url,
                "hub_bind_url": f"http://127.0.0.1:{free_port()}",
                "authenticator_class": "autograde_tests.hub.accounts.PasswordPerAccount",
                "db_url": f"sqlite:///{state / 'jupyterhub.sqlite'}",
                "cookie_secret_file": str(state / "jupyterhub_cookie_secret"),
                "pid_file": str(state / "jupyterhub.pid"),
            },
            "ConfigurableHTTPProxy": {
                "command": [str(self.proxy)],
                "api_url": f"http://127.0.0.1:{free_port()}",
                "pid_file": str(state / "proxy.pid"),
            },
            "PasswordPerAccount": {"passwords": self.passwords},
            "Authenticator": {"allowed_users": sorted(self.passwords)},
            "Spawner": {
                "cmd": [str(VENV_BIN / "jupyterhub-singleuser")],
                "environment": self.server_env(),
                "default_url": "/lab",
                # JupyterLab's first start on a busy machine can take over a minute.
                "start_timeout": 180,
                "http_timeout": 180,
            },
        }

    def _start(self) -> None:
        state = self.root / "state"
        state.mkdir(mode=0o700)
        config = state / "jupyterhub_config.json"
        config.write_text(json.dumps(self._hub_config(state), indent=1))
        log_file = state / "jupyterhub.log"
        with open(log_file, "w") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=state,
                env=os.environ | {"PATH": self.server_env()["PATH"]},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if not answers(f"{self.url}hub/api/", self._process, 120):
            # The state folder goes with the hub: say its last words here.
            last = (log_file.read_text().strip().splitlines() or ["no log"])[-1]
            raise HubError(f"JupyterHub did not start: {last}")

    def _stop(self) -> None:
        """JupyterHub stops the users' servers and the proxy itself; what it leaves is killed."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        for pid_file in (self.root / "state").glob("*.pid"):
            _kill(int(pid_file.read_text() or 0))
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.wait()
        self._process = None


def answers(url: str, process: subprocess.Popen, seconds: float) -> bool:
    """Whether ``url`` answers within ``seconds`` while the server ``process`` that should serve it runs."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return True
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.5)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(pid: int) -> None:
    if pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
