"""A real ``scrapyd`` on a free loopback port, for tests.

The server runs in its own temporary directory with its own ``scrapyd.conf``
(eggs, logs, items and databases all live there), so nothing it writes lands
in the repository or depends on the caller's working directory.

Scrapyd appends a job's egg to the *end* of ``sys.path``, so an installed copy
of the project (``bin/setup`` installs it in editable mode) would win over
the deployed egg. Like a real Scrapyd host, which has the project's
dependencies but not the project, the server runs under :func:`isolated_python`:
an interpreter that sees the packages of the test environment but not its
``.pth`` hooks (editable installs live in those).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.redis_server import FreePortServer, free_port

__all__ = ["ScrapydError", "ScrapydServer", "isolated_python"]


class ScrapydError(RuntimeError):
    """Scrapyd answered ``{"status": "error"}`` or could not be reached."""


def isolated_python(directory: str | Path) -> Path:
    """Make a venv in *directory* whose ``sys.path`` holds the current
    environment's site-packages as plain entries, and return its interpreter.

    Plain entries, unlike site directories, have their ``.pth`` files ignored:
    the project's own packages are importable there only from an egg.
    """
    directory = Path(directory)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = directory / "bin" / "python"
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    Path(site_packages, "_host_environment.pth").write_text("".join(f"{p}\n" for p in paths))
    return python


class ScrapydServer(FreePortServer):
    """``with ScrapydServer() as scrapyd: scrapyd.url`` -> ``http://127.0.0.1:PORT/``.

    *python* is the interpreter that runs Scrapyd and, through it, every job.
    """

    def __init__(self, *, python: str | Path = sys.executable, port: int | None = None,
                 directory: str | Path | None = None, poll_interval: float = 0.2,
                 jobs_to_keep: int = 10) -> None:
        self.python = str(python)
        self._picked = port is None
        self.port = port or free_port()
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="vertical-scrapyd-")
        self.directory = Path(directory or self._tmp.name).resolve()
        self.poll_interval = poll_interval
        self.jobs_to_keep = jobs_to_keep
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def items_dir(self) -> Path:
        return self.directory / "items"

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def server_log(self) -> Path:
        return self.directory / "scrapyd.out"

    # -- process ----------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ScrapydServer:
        if self.process is None:
            self._start_on_a_port(timeout, "scrapyd", self.server_log.read_text)
        return self

    def _start(self, timeout: float) -> bool:
        (self.directory / "scrapyd.conf").write_text(
            "[scrapyd]\n"
            "bind_address = 127.0.0.1\n"
            f"http_port = {self.port}\n"
            f"eggs_dir = {self.directory / 'eggs'}\n"
            f"logs_dir = {self.logs_dir}\n"
            f"items_dir = {self.items_dir.as_uri()}\n"
            f"dbs_dir = {self.directory / 'dbs'}\n"
            f"jobs_to_keep = {self.jobs_to_keep}\n"
            f"poll_interval = {self.poll_interval}\n"
            "max_proc = 2\n"
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SCRAPY_SETTINGS_MODULE")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        # scrapyd.conf is read from the working directory; jobs inherit it too,
        # so no scrapy.cfg of the caller's is found by Scrapy in the jobs.
        with self.server_log.open("wb") as out:
            self.process = subprocess.Popen([self.python, "-m", "scrapyd", "--pidfile="], cwd=self.directory,
                                            stdout=out, stderr=subprocess.STDOUT, env=env)
        # Twisted logs this once it listens: until then an answer on the port
        # may come from another Scrapyd that took it meanwhile.
        listening = f"Site starting on {self.port}"
        deadline = time.monotonic() + timeout
        while True:
            log = self.server_log.read_text(errors="replace")
            try:
                if listening in log and self.get("daemonstatus.json").get("status") == "ok":
                    return True
            except ScrapydError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                if "Address already in use" in log:
                    return False
                raise RuntimeError(f"scrapyd did not start on port {self.port}:\n{log}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> ScrapydServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- API ----------------------------------------------------------------------

    def get(self, endpoint: str, **params: str) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return self._call(urllib.request.Request(self.url + endpoint + query))

    def post(self, endpoint: str, params: list[tuple[str, str]]) -> dict[str, Any]:
        """POST form fields; a list, since Scrapyd repeats ``setting``."""
        body = urllib.parse.urlencode(params).encode()
        return self._call(urllib.request.Request(self.url + endpoint, data=body))

    def _call(self, request: urllib.request.Request) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.load(response)
        except (OSError, ValueError) as exc:  # urllib.error.URLError is an OSError
            raise ScrapydError(f"{request.full_url}: {exc}") from exc
        if answer.get("status") != "ok":
            raise ScrapydError(f"{request.full_url}: {answer.get('message', answer)}")
        return answer

    def schedule(self, project: str, spider: str, *, settings: dict[str, Any] | None = None,
                 **args: Any) -> str:
        """Schedule a job (``-d setting=K=V`` and ``-d ARG=V``); return its id."""
        params = [("project", project), ("spider", spider)]
        params += [("setting", f"{key}={value}") for key, value in (settings or {}).items()]
        params += [(key, str(value)) for key, value in args.items()]
        return self.post("schedule.json", params)["jobid"]

    def wait_finished(self, project: str, spider: str, job: str, timeout: float = 180.0) -> dict[str, Any]:
        """Wait until *job* is among the finished jobs and return its entry."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.get("listjobs.json", project=project)["finished"]:
                if entry["id"] == job:
                    return entry
            time.sleep(0.1)
        raise AssertionError(f"job {job} did not finish within {timeout}s:\n{self.job_log(project, spider, job)}")

    def items_file(self, project: str, spider: str, job: str) -> Path:
        return self.items_dir / project / spider / f"{job}.jl"

    def items(self, project: str, spider: str, job: str) -> list[dict[str, Any]]:
        path = self.items_file(project, spider, job)
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def job_log(self, project: str, spider: str, job: str) -> str:
        path = self.logs_dir / project / spider / f"{job}.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
