"""Shared pieces of the browser tests: find Chromium, serve a folder or JupyterLab on localhost, open pages."""

import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autograde_tests.hub.local_hub import answers, free_port

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """The system's Chromium, or skip with a plain reason (the tests never download a browser)."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("browser tests skipped: no Chromium on this machine (install Debian's `chromium`)")
    return path


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` over HTTP on a free localhost port; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def jupyterlab(root: Path, scratch: Path, token: str, config_path: Path | None = None) -> Iterator[str]:
    """JupyterLab from the course's environment serving ``root`` on a free localhost port, with its own
    configuration and runtime folders in ``scratch`` and, if given, ``config_path`` as JUPYTER_CONFIG_PATH
    (the instructor's parts); yields the base URL, stops the server after."""
    port = free_port()
    env = os.environ | {
        "JUPYTER_CONFIG_DIR": str(scratch / "config"),
        "JUPYTER_RUNTIME_DIR": str(scratch / "runtime"),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
    }
    env.pop("JUPYTER_CONFIG_PATH", None)
    if config_path is not None:
        env["JUPYTER_CONFIG_PATH"] = str(config_path)
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
               "--ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               # window.jupyterapp: the tests wait on JupyterLab's own state (a kernel's info applied, a save done).
               "--LabApp.expose_app_in_browser=True"]
    log = open(scratch / "jupyterlab.log", "w")
    server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"
    try:
        if not answers(f"{base}api/status?token={token}", server, 60):
            pytest.fail(f"JupyterLab did not start; see {scratch / 'jupyterlab.log'}")
        yield base
    finally:
        server.terminate()  # JupyterLab shuts its kernels down first: slow on a busy machine
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield instance
        finally:
            instance.close()
