"""The sign-up example: a page that checks a username while the user types, and a sign-up
that INSERTs into the application's own table, then tells libmember (README.md beside this).

Standard library HTTP server; PostgreSQL through psycopg 3; the module through the
``libmember`` client (clients/python). Run: ``python app.py`` (``make demo`` does, with the
addresses ``make run`` uses).
"""

import argparse
import json
import logging
import re
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import libmember
import psycopg
import redis

# The set attached to the table: its answers come from signup.users.username.
SET = "signup_users"
# The application's own table. The unique index on lower(username) decides every race, and
# serves the module's point lookup under NORMALIZE lower.
SCHEMA = """
CREATE SCHEMA IF NOT EXISTS signup;
CREATE TABLE IF NOT EXISTS signup.users (
    id         bigserial PRIMARY KEY,
    username   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS users_username_lower ON signup.users (lower(username));
"""
# ASCII only, so the module's lowercase and PostgreSQL's lower() always agree.
NAME = re.compile(r"[A-Za-z0-9_]{3,20}")
PAGE = (Path(__file__).parent / "index.html").read_bytes()

log = logging.getLogger("signup")


class App:
    """The two things the page asks for. Every answer is the module's or the database's."""

    def __init__(self, pg_url: str, sets: libmember.Sets) -> None:
        self.pg_url = pg_url
        self.sets = sets

    def setup(self) -> None:
        """Makes the table (if missing) and the set attached to it (CREATE of an existing
        set with the same settings is fine). SYNC log: rows written by anyone else, or a
        sign-up whose MEMBER.ADD was lost, still reach the filter within about a second."""
        with psycopg.connect(self.pg_url, autocommit=True) as db:
            db.execute(SCHEMA)
        self.sets.create(
            SET, source="signup.users", column="username", sync="log", normalize="lower"
        )

    def check(self, name: str) -> tuple:
        """(HTTP status, reply) for "is this name free?": one MEMBER.EXISTS, no SQL here."""
        name = name.strip()
        if not NAME.fullmatch(name):
            return HTTPStatus.OK, reply(name, "invalid", "3 to 20 letters, digits or _")
        try:
            taken = self.sets.exists(SET, name)
        except (libmember.Unavailable, redis.ConnectionError) as e:
            # Never a guess: no answer is shown as none.
            log.warning("check %r: %s", name, e)
            return HTTPStatus.SERVICE_UNAVAILABLE, reply(name, "unknown", "cannot check now")
        if taken:
            return HTTPStatus.OK, reply(name, "taken", f"{name} is taken")
        return HTTPStatus.OK, reply(name, "available", f"{name} is available")

    def sign_up(self, name: str) -> tuple:
        """(HTTP status, reply) for a sign-up: the INSERT decides, then MEMBER.ADD."""
        name = name.strip()
        if not NAME.fullmatch(name):
            return HTTPStatus.BAD_REQUEST, reply(name, "invalid", "3 to 20 letters, digits or _")
        try:
            with psycopg.connect(self.pg_url) as db:  # commits when the block ends
                db.execute("INSERT INTO signup.users (username) VALUES (%s)", (name,))
        except psycopg.errors.UniqueViolation:
            # Someone else has the name: maybe a moment ago, while this page said "available".
            return HTTPStatus.CONFLICT, reply(name, "taken", f"{name} is taken: pick another")
        try:
            # The row is committed: the module checks it is there, then every node answers
            # "taken" at once.
            self.sets.add(SET, name)
        except (libmember.Unavailable, redis.RedisError) as e:
            # The user exists; the change-log trigger brings the name to the filter soon.
            log.warning("MEMBER.ADD %r after the INSERT: %s", name, e)
        return HTTPStatus.CREATED, reply(name, "created", f"Welcome, {name}!")


def reply(name: str, status: str, message: str) -> dict:
    return {"username": name, "status": status, "message": message}


class Handler(BaseHTTPRequestHandler):
    """GET / (the page), GET /check?username=…, POST /signup with {"username": …}."""

    app: App

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/":
            self.send(HTTPStatus.OK, PAGE, "text/html; charset=utf-8")
        elif url.path == "/check":
            name = parse_qs(url.query).get("username", [""])[0]
            self.send_json(*self.app.check(name))
        else:
            self.send_json(HTTPStatus.NOT_FOUND, {"status": "not found"})

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/signup":
            return self.send_json(HTTPStatus.NOT_FOUND, {"status": "not found"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            name = body["username"]
            assert isinstance(name, str)
        except (ValueError, KeyError, TypeError, AssertionError):
            return self.send_json(HTTPStatus.BAD_REQUEST, {"status": "bad request"})
        self.send_json(*self.app.sign_up(name))

    def send_json(self, status: int, body: dict) -> None:
        self.send(status, json.dumps(body).encode(), "application/json")

    def send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        log.info("%s %s", self.address_string(), format % args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--pg", default="host=127.0.0.1 port=5433 user=postgres dbname=postgres",
                   help="libpq connection string of the application's database")
    p.add_argument("--valkey", default="redis://127.0.0.1:6380",
                   help="URL of the server with the module")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    app = App(args.pg, libmember.Sets(redis.Redis.from_url(args.valkey, decode_responses=True)))
    try:
        app.setup()
    except libmember.NoPermission as e:
        raise SystemExit(f"{e}\nthe operator must allow it: CONFIG SET member.attach-allow "
                         "signup.users (make demo does)")
    Handler.app = app
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    log.info("listening on http://%s:%d/", args.host, server.server_port)
    server.serve_forever()


if __name__ == "__main__":
    main()
