"""A file server on the loopback address for the download tests: plain files (with
Range, ETag and If-Range, as a resumable HTTP server answers) and the two endpoints
huggingface_hub's `hf_hub_download` asks a hub for (HEAD and GET of
`/{repo}/resolve/{revision}/{file}`, answering with `X-Repo-Commit` and an ETag).

`drop_after[path] = n` makes the next response to `path` announce the whole length,
send `n` bytes and close the connection (a dropped download); with `down_after_drop`
the path then answers 503 until it is taken out of `unavailable`. `hold_after[path] =
(n, event)` sends `n` bytes and waits for `event` before the rest (a download caught
in flight). Every request is logged (method, path, Range, If-Range), so a test can
assert that a download was resumed and where from.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    if_range: str | None


@dataclass
class FileServer:
    files: dict[str, bytes] = field(default_factory=dict)  # path -> bytes
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo -> file -> bytes
    commit: str = COMMIT
    drop_after: dict[str, int] = field(default_factory=dict)
    down_after_drop: bool = False
    unavailable: set[str] = field(default_factory=set)
    hold_after: dict[str, tuple[int, threading.Event]] = field(default_factory=dict)
    log: list[Logged] = field(default_factory=list)
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.endpoint}/{path.lstrip('/')}"

    def requests(self, path: str) -> list[Logged]:
        return [r for r in self.log if r.path == "/" + path.lstrip("/")]

    def lookup(self, path: str) -> bytes | None:
        if "/resolve/" in path:
            repo, _, rest = path.strip("/").partition("/resolve/")
            _revision, _, name = rest.partition("/")
            return self.repos.get(repo, {}).get(name)
        return self.files.get(path.lstrip("/"))


def left_behind(home: Path, name: str) -> list[str]:
    """Whatever a download of `name` could have left: a record, store files, partials."""
    from engine.catalog.store import Catalog

    found = []
    data = Catalog().data()
    found += [f"record {kind}/{name}" for kind in ("models", "adapters", "variants")
              if name in data[kind]]
    for folder in (home / "adapters" / name, home / "models" / name):
        if folder.exists():
            found.append(str(folder))
    downloads_dir = home / "cache" / "downloads"
    if downloads_dir.exists():
        found += [str(p) for p in downloads_dir.rglob("*") if not p.name.endswith(".lock")]
    return found


@contextmanager
def serving(server: FileServer) -> Iterator[FileServer]:
    handler = type("Handler", (_Handler,), {"files": server})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="file-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


class _Handler(BaseHTTPRequestHandler):
    files: FileServer

    def log_message(self, *_args: Any) -> None:  # quiet
        return None

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        self.files.log.append(Logged(self.command, path, self.headers.get("Range"),
                                     self.headers.get("If-Range")))
        data = self.files.lookup(path)
        hub = "/resolve/" in path
        if path.lstrip("/") in self.files.unavailable:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if data is None:
            self.send_response(404)
            if hub:
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("X-Repo-Commit", self.files.commit)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        etag = f'"{hashlib.sha256(data).hexdigest()}"'
        start = 0
        wanted = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        match = _RANGE.match(wanted or "")
        partial = bool(match) and (if_range is None or if_range == etag)
        if partial:
            assert match is not None
            start = int(match.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(206 if partial else 200)
        self.send_header("Content-Length", str(len(data) - start))
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        if hub:
            self.send_header("X-Repo-Commit", self.files.commit)
        self.end_headers()
        if not body:
            return
        key = path.lstrip("/")
        drop = self.files.drop_after.pop(key, None)
        if drop is not None:
            self.wfile.write(data[start:start + drop])
            self.wfile.flush()
            self.close_connection = True
            if self.files.down_after_drop:
                self.files.unavailable.add(key)
            # Close the socket now: a dropped connection, not a slow one.
            self.connection.shutdown(2)
            return
        hold = self.files.hold_after.pop(key, None)
        if hold is not None:
            count, event = hold
            self.wfile.write(data[start:start + count])
            self.wfile.flush()
            event.wait(60)  # bounded: a test that forgets to release it still ends
            start += count
        self.wfile.write(data[start:])
