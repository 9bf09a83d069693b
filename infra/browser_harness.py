"""Real server + Debian Chromium for the browser test and the browser benchmark.

``ServerProcess`` runs ``python -m server serve`` on 127.0.0.1 as a subprocess (its output goes
to a log file, never to a pipe that could fill up) and waits for ``/readyz``. ``launch_chromium``
starts Debian's ``/usr/bin/chromium`` through Playwright with the flags a headless WebRTC run
needs (fake camera/microphone, loopback ICE candidates, no mDNS obfuscation) and a fresh profile.
Playwright's own browser downloads are never used: a missing Chromium is a
``ChromiumMissingError`` telling the user to run ``make test``, which installs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Self

import httpx

__all__ = [
    "CHROMIUM_FLAGS",
    "CHROMIUM_PATH",
    "ChromiumMissingError",
    "ServerExitedError",
    "ServerProcess",
    "free_port",
    "launch_chromium",
    "require_chromium",
]

log = logging.getLogger(__name__)

CHROMIUM_PATH = "/usr/bin/chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
)
REPO_ROOT = Path(__file__).resolve().parents[1]


class ChromiumMissingError(RuntimeError):
    """Debian's Chromium is not installed where the browser tests expect it."""


class ServerExitedError(RuntimeError):
    """The server subprocess exited (or never became ready); the message quotes its log."""


def require_chromium(path: str = CHROMIUM_PATH) -> str:
    """Return ``path`` if it is an executable Chromium, else raise ChromiumMissingError."""
    if not os.access(path, os.X_OK):
        raise ChromiumMissingError(
            f"{path} is missing: the browser tests drive Debian's Chromium. Run `make test` "
            "(it installs the `chromium` package when missing), or `apt-get install -y chromium`; "
            "never `playwright install`."
        )
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (the OS picks; a race with other processes is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``python -m server serve`` on 127.0.0.1 as a subprocess; ``stop()`` is idempotent.

    Use as a context manager, or ``start()`` / ``stop()``. ``start`` returns once ``/readyz``
    answers 200 and raises ServerExitedError (quoting the log tail) if the process exits or
    ``timeout_s`` passes first.
    """

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        cwd: Path = REPO_ROOT,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path)
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = extra_args
        self.env = env
        self.cwd = Path(cwd)  # the checkout whose server runs (another one: A/B benchmarks)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "server",
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--ice-host",
            self.host,
            "--data-dir",
            str(self.data_dir),
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 90.0) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        self._proc = subprocess.Popen(
            self.command(),
            cwd=self.cwd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerExitedError(
                    f"server exited with {self._proc.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise ServerExitedError(f"not ready (/readyz) within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, num_lines: int = 40) -> str:
        if self._log_file is not None:
            self._log_file.flush()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join(lines[-num_lines:])

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise ServerExitedError("the server is not running")
        return self._proc.pid

    def signal(self, sig: int) -> None:
        """Sends ``sig`` (e.g. SIGTERM for a graceful shutdown, SIGKILL for a crash)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """The exit code once the process ended (``subprocess.TimeoutExpired`` after
        ``timeout_s``); the server is then stopped (log closed)."""
        if self._proc is None:
            raise ServerExitedError("the server is not running")
        code = self._proc.wait(timeout=timeout_s)
        self.stop()
        return code

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "server pid %d ignored SIGINT for %.0f s; killing it", proc.pid, timeout_s
                )
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_chromium(
    playwright: Any,
    user_data_dir: Path,
    *,
    width: int = 1440,
    height: int = 900,
    executable_path: str = CHROMIUM_PATH,
) -> Any:
    """A persistent Chromium context (sync Playwright API) with a fresh ``user_data_dir``.

    ``--user-data-dir`` is how Playwright's persistent context passes the profile directory.
    Raises ChromiumMissingError when Chromium is not installed.
    """
    require_chromium(executable_path)
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir),
        executable_path=executable_path,
        headless=True,
        args=list(CHROMIUM_FLAGS),
        viewport={"width": width, "height": height},
    )
