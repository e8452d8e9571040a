"""Make sure PostgreSQL and Redis answer before the portal or its tests start.

Prints `export NAME=value` lines for the calling shell to eval. For each
service: use the configured URL if it answers; if the URL was not set and the
machine's own service is down, start it (Debian's pg_ctlcluster, redis-server);
failing that, start a private one under .run/. When nothing works, say exactly
what to start and exit 1.

Usage: python scripts/lib/services.py [--database NAME]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import environ
import psycopg
import redis

ROOT = Path(__file__).resolve().parents[2]
RUN_DIR = ROOT / ".run"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
PRIVATE_PG_PORT = 54329
PRIVATE_REDIS_PORT = 63799


def say(message: str) -> None:
    print(message, file=sys.stderr)


def configured(name: str) -> str | None:
    """A setting from the environment or .env, as the portal itself would read it."""
    env_file = ROOT / ".env"
    if env_file.is_file():
        environ.Env.read_env(env_file)  # fills in only what the environment leaves unset
    return os.environ.get(name) or None


def pg_answers(url: str) -> bool:
    parts = urlsplit(url)
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    try:
        with psycopg.connect(admin_url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def wait_for(check, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def start_system_postgres() -> bool:
    if not shutil.which("pg_ctlcluster") or not Path("/etc/postgresql").is_dir():
        return False
    for version in sorted(os.listdir("/etc/postgresql")):
        say(f"Starting the machine's PostgreSQL {version} …")
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            check=False,
            stdout=subprocess.DEVNULL,
        )
    return wait_for(lambda: pg_answers(DEFAULT_DATABASE_URL))


def _as_postgres_user(command: list[str]) -> list[str]:
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def start_private_postgres() -> str | None:
    initdb = shutil.which("initdb") or next(
        iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))), None
    )
    if not initdb:
        return None
    bindir = Path(initdb).resolve().parent
    data = RUN_DIR / "postgres"
    url = f"postgres://postgres@127.0.0.1:{PRIVATE_PG_PORT}/portal"
    if pg_answers(url):
        return url
    RUN_DIR.mkdir(exist_ok=True)
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(data, "postgres", "postgres")
        say(f"Creating a private PostgreSQL in {data} …")
        subprocess.run(
            _as_postgres_user([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    log = data / "server.log"
    say(f"Starting the private PostgreSQL on 127.0.0.1:{PRIVATE_PG_PORT} …")
    subprocess.run(
        _as_postgres_user(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-o",
                f"-p {PRIVATE_PG_PORT} -c listen_addresses=127.0.0.1 -k {data}",
                "start",
            ]
        ),
        check=False,
        stdout=subprocess.DEVNULL,
    )
    return url if wait_for(lambda: pg_answers(url)) else None


def ensure_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    admin_url = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            say(f"Creating database {name} …")
            conn.execute(f'CREATE DATABASE "{name}"')


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=3).ping())
    except redis.RedisError:
        return False


def start_redis(port: int) -> str | None:
    server = shutil.which("redis-server")
    if not server:
        return None
    RUN_DIR.mkdir(exist_ok=True)
    url = f"redis://127.0.0.1:{port}/0"
    say(f"Starting Redis on 127.0.0.1:{port} …")
    subprocess.run(
        [
            server,
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(RUN_DIR),
            "--logfile",
            str(RUN_DIR / f"redis-{port}.log"),
        ],
        check=False,
        stdout=subprocess.DEVNULL,
    )
    return url if wait_for(lambda: redis_answers(url)) else None


def ensure_postgres() -> str:
    url = configured("DATABASE_URL")
    if url:
        if pg_answers(url):
            return url
        say(
            f"PostgreSQL does not answer at DATABASE_URL={url}.\n"
            "Start that server, or unset DATABASE_URL to let this script use or start a local one."
        )
        sys.exit(1)
    if pg_answers(DEFAULT_DATABASE_URL) or start_system_postgres():
        return DEFAULT_DATABASE_URL
    private = start_private_postgres()
    if private:
        return private
    say(
        "PostgreSQL is not running on 127.0.0.1:5432 and could not be started here.\n"
        "Install and start it (Debian: apt-get install postgresql && pg_ctlcluster 15 main start),\n"
        "or set DATABASE_URL=postgres://USER:PASSWORD@HOST:PORT/portal."
    )
    sys.exit(1)


def ensure_redis() -> str:
    url = configured("REDIS_URL")
    if url:
        if redis_answers(url):
            return url
        say(
            f"Redis does not answer at REDIS_URL={url}.\n"
            "Start that server, or unset REDIS_URL to let this script use or start a local one."
        )
        sys.exit(1)
    if redis_answers(DEFAULT_REDIS_URL):
        return DEFAULT_REDIS_URL
    for port in (6379, PRIVATE_REDIS_PORT):
        url = start_redis(port)
        if url:
            return url
    say(
        "Redis is not running on 127.0.0.1:6379 and could not be started here.\n"
        "Install and start it (Debian: apt-get install redis-server && redis-server --daemonize yes),\n"
        "or set REDIS_URL=redis://HOST:PORT/0."
    )
    sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--create-database", action="store_true", help="create the database of DATABASE_URL")
    args = parser.parse_args()
    database_url = ensure_postgres()
    if args.create_database:
        ensure_database(database_url)
    redis_url = ensure_redis()
    print(f"export DATABASE_URL={shlex.quote(database_url)}")
    print(f"export REDIS_URL={shlex.quote(redis_url)}")


if __name__ == "__main__":
    main()
