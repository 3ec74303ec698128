"""JupyterLab with nbgrader's extension, on localhost against a scratch copy of the course:
the formgrader lists every chapter as an assignment."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from autograde_tests import course

from .browser import browser, chromium

REPO = Path(__file__).resolve().parents[1]
TOKEN = "course-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    chromium()  # skip before starting anything when there is no browser
    root = course.scratch_course(REPO, tmp_path_factory.mktemp("course"))
    for chapter in course.chapters(root):
        course.release(root, chapter)
    port = free_port()
    scratch = tmp_path_factory.mktemp("jupyter")
    env = os.environ | {
        "JUPYTER_CONFIG_DIR": str(scratch / "config"),
        "JUPYTER_RUNTIME_DIR": str(scratch / "runtime"),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
    }
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
               "--ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}"]
    log = open(scratch / "jupyterlab.log", "w")
    server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start; see {scratch / 'jupyterlab.log'}")
                time.sleep(0.5)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=20)
        log.close()


def test_formgrader_lists_every_chapter(jupyterlab):
    with browser() as instance:
        page = instance.new_page()
        page.goto(f"{jupyterlab}formgrader?token={TOKEN}", wait_until="load")
        for chapter in course.chapters(REPO):
            page.get_by_text(chapter, exact=True).first.wait_for(timeout=30000)
        page.close()
