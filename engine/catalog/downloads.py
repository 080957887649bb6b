"""Downloading base models and adapters, then importing them like any file.

A download fetches from a URL (plain HTTP(S), with `urllib`) or a Hugging Face
repository (`huggingface_hub`) into a folder of the data directory's cache, outside
the store, then hands the file to `engine.catalog.imports` — the one import pipeline —
exactly as `--file` would: the same inspection, validation against the base, hashing
and staging. The record's `source` is the URL (or the repo, file and resolved commit),
and its `download` field keeps the same as data.

What is left behind:
- a download that fails (connection dropped, server error) keeps its partial file in
  `<data>/cache/downloads/<key>/`, keyed by the source, so the same command resumes it:
  an HTTP Range request from the partial's size, guarded by If-Range so a changed
  resource starts over. (huggingface_hub retries and resumes within one call itself.)
- a download that is cancelled, does not match `--sha256`, or is refused by the import
  leaves nothing: no partial, no catalog record, nothing in the store.

Nothing sent by a server becomes a path: the file's name is the URL's last path segment
when it passes `_SEGMENT` (else a fixed name), or the repo file name the user typed,
checked the same way; sizes are bounded (`MAX_BYTES`) and the free disk space is checked
against the announced size before anything is written.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from engine import __version__
from engine.catalog import digest, imports, validation
from engine.catalog.store import Catalog, now_iso
from engine.errors import Cancelled, RefusedError, StudioError, UsageError
from engine.formats.safeio import printable
from engine.state import paths
from engine.state.statefile import write_json_atomic

Stage = Callable[[str], None]

MAX_BYTES = {"model": 256 << 30, "adapter": 16 << 30}  # what one download may hold
CHUNK = 256 << 10
TIMEOUT = 30.0  # seconds a connection may stay silent before it counts as dropped
RETRIES = 5  # reconnections (resuming) in one call after a drop, before it gives up
PEFT_FILES = ("adapter_model.safetensors", "adapter_config.json")
FIXED_NAMES = {"model": "model.gguf", "adapter": "adapter.gguf"}

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_REPO = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class DownloadError(StudioError):
    """The server could not be reached or the transfer broke; a partial file is kept
    to resume. Exit code 7."""

    exit_code = 7


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """Where a download comes from: a URL, or a Hugging Face repo and its file(s)."""

    url: str | None = None
    repo: str | None = None
    filename: str | None = None  # the file in the repo ('/'-separated); None: a PEFT pair
    revision: str | None = None
    sha256: str | None = None  # expected digest of the (weights) file

    @staticmethod
    def parse(kind: str, url: str | None = None, repo: str | None = None,
              filename: str | None = None, revision: str | None = None,
              sha256: str | None = None) -> Source:
        """A checked source; every mistake is a one-line UsageError, before anything runs."""
        if (url is None) == (repo is None):
            raise UsageError("give either a URL or a Hugging Face repo")
        if sha256 is not None:
            sha256 = check_sha256(sha256)
        if url is not None:
            if filename is not None or revision is not None:
                raise UsageError("--filename and --revision go with --hf (a URL names its "
                                 "file)")
            return Source(url=check_url(url), sha256=sha256)
        assert repo is not None
        if not _REPO.match(repo) or ".." in repo or "--" in repo:
            raise UsageError(f"invalid Hugging Face repo id {printable(repo, 120)!r}: use "
                             "NAMESPACE/NAME (letters, digits, '.', '_', '-')")
        if filename is not None:
            filename = check_repo_file(filename)
        elif kind == "model":
            raise UsageError("a model from a Hugging Face repo needs its file name (the "
                             "GGUF file in the repo: --filename)")
        if revision is not None and (not _REVISION.match(revision) or ".." in revision):
            raise UsageError(f"invalid revision {printable(revision, 120)!r}: a branch, tag "
                             "or commit")
        return Source(repo=repo, filename=filename, revision=revision, sha256=sha256)

    def files(self) -> tuple[str, ...]:
        """The repo files this source fetches: one, or a PEFT adapter's pair (also when
        the file named is a PEFT weights file in a subfolder)."""
        if self.filename is None:
            return PEFT_FILES
        folder, _, leaf = self.filename.rpartition("/")
        if leaf == PEFT_FILES[0]:
            return tuple(f"{folder}/{name}" if folder else name for name in PEFT_FILES)
        return (self.filename,)

    def key(self, kind: str) -> str:
        """The cache folder's name: the same source resumes the same partial file."""
        what = {"kind": kind, "url": self.url, "repo": self.repo, "files": list(self.files())
                if self.repo else None, "revision": self.revision}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]

    def describe(self, commit: str | None = None) -> str:
        """What the record's `source` says: the URL, or repo, file and revision."""
        if self.url is not None:
            return self.url
        what = self.filename or "PEFT adapter (adapter_model.safetensors, adapter_config.json)"
        revision = self.revision or "main"
        pinned = f", commit {commit}" if commit and commit != revision else ""
        return f"Hugging Face {self.repo}: {what} at {revision}{pinned}"


def check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"not an http(s) URL: {printable(url, 200)!r}")
    if parts.username or parts.password:
        # It would be recorded as the entry's source, in plain text.
        raise UsageError("a URL with a user name or password is refused (it would be "
                         "stored as the source)")
    return urllib.parse.urlunsplit(parts)


def check_repo_file(name: str) -> str:
    parts = name.strip().split("/")
    if len(name) > 255 or not all(_SEGMENT.match(p) for p in parts):
        raise UsageError(f"invalid file name {printable(name, 120)!r}: '/'-separated parts "
                         "of letters, digits, '.', '_' and '-', each starting with a letter "
                         "or digit")
    return "/".join(parts)


def check_sha256(text: str) -> str:
    value = text.strip().lower()
    if not _SHA256.match(value):
        raise UsageError(f"a sha256 is 64 hexadecimal digits, not {printable(text, 80)!r}")
    return value


def url_file_name(url: str, kind: str) -> str:
    """The downloaded file's name: the URL's last path segment if it is a plain name
    (checked like a store name), else a fixed one. Never anything the server sends."""
    segment = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if _SEGMENT.match(segment) and ".." not in segment:
        return segment
    return FIXED_NAMES[kind]


# --------------------------------------------------------------------------- fetching


@dataclass(frozen=True)
class Fetched:
    """A complete download in the cache, not yet imported."""

    path: Path  # the file, or the folder holding a PEFT pair
    weights: Path  # the file --sha256 is about
    folder: Path  # the cache folder (removed once it is imported or refused)
    record: dict[str, Any]  # the record's `download` field
    source: str  # the record's `source`


def cache_folder(source: Source, kind: str) -> Path:
    return paths.cache_dir() / "downloads" / source.key(kind)


def partial_files(source: Source, kind: str) -> list[Path]:
    """The partial files kept for `source` (for tests and the window's Resume)."""
    folder = cache_folder(source, kind)
    return sorted(p for p in folder.rglob("*.part") if p.is_file()) if folder.exists() else []


@contextmanager
def _claim(folder: Path) -> Iterator[None]:
    """One download of a source at a time (another process may be resuming it)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise DownloadError("this source is being downloaded by another process") from None
    try:
        yield
    finally:
        lock.release()  # the empty lock file stays: deleting it would race a new claim


def discard(source: Source, kind: str) -> None:
    """Forget `source`'s partial download (nothing else is touched)."""
    folder = cache_folder(source, kind)
    shutil.rmtree(folder, ignore_errors=True)


def fetch(source: Source, kind: str, progress: digest.Progress | None = None,
          cancelled: digest.CancelCheck | None = None, retries: int = RETRIES) -> Fetched:
    """Download `source` into its cache folder (resuming a partial one). Raises
    DownloadError (partial kept), Cancelled (partial removed) or a refusal."""
    folder = cache_folder(source, kind)
    cancelled = cancelled or (lambda: False)
    with _claim(folder):
        try:
            if source.url is not None:
                return _fetch_url(source, kind, folder, progress, cancelled, retries)
            return _fetch_hf(source, kind, folder, progress, cancelled)
        except (DownloadError, KeyboardInterrupt):
            # A failure or Ctrl-C keeps the partial: the same command resumes it. (A
            # cancel, below, is "I do not want it": nothing is kept.)
            if not partial_files(source, kind):  # nothing to resume (e.g. HTTP 404)
                shutil.rmtree(folder, ignore_errors=True)
            raise
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise


def _fetch_url(source: Source, kind: str, folder: Path, progress: digest.Progress | None,
               cancelled: digest.CancelCheck, retries: int) -> Fetched:
    assert source.url is not None
    name = url_file_name(source.url, kind)
    target = folder / name
    part = folder / (name + ".part")
    meta = folder / ".download.json"  # the validators If-Range needs to resume
    folder.mkdir(parents=True, exist_ok=True)
    attempts = 0
    while True:
        try:
            info = _http_attempt(source.url, part, meta, MAX_BYTES[kind], progress, cancelled)
            break
        except _Dropped as exc:
            attempts += 1
            if attempts > retries:
                done = part.stat().st_size if part.exists() else 0
                size = f" of {exc.total}" if exc.total else ""
                raise DownloadError(
                    f"download of {name} interrupted after {done}{size} bytes ({exc.reason});"
                    " the partial file is kept: run it again to resume") from None
    if cancelled():
        raise Cancelled(f"download of {name} was cancelled")
    part.rename(target)
    meta.unlink(missing_ok=True)
    record = {"url": source.url, "file": name, "size": target.stat().st_size,
              "etag": info.get("etag"), "last_modified": info.get("last_modified"),
              "downloaded_at": now_iso()}
    return Fetched(target, target, folder, {k: v for k, v in record.items() if v is not None},
                   source.describe())


class _Dropped(Exception):
    """The connection broke or went silent mid-transfer: resumable."""

    def __init__(self, reason: str, total: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.total = total


def _opener() -> urllib.request.OpenerDirector:
    """HTTP and HTTPS only (a redirect to file:// or ftp:// fails), proxies from the
    environment, redirects followed (urllib keeps the Range header across them)."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.HTTPHandler(),
                    urllib.request.HTTPSHandler(), urllib.request.HTTPRedirectHandler(),
                    urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def _read_meta(meta: Path) -> dict[str, Any]:
    try:
        value = json.loads(meta.read_text(encoding="utf-8"))
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _http_attempt(url: str, part: Path, meta: Path, limit: int,
                  progress: digest.Progress | None, cancelled: digest.CancelCheck
                  ) -> dict[str, Any]:
    """One request: resume `part` if it has bytes (Range + If-Range), else start it.
    Returns the validators the server gave; raises _Dropped when the body breaks off."""
    have = part.stat().st_size if part.exists() else 0
    known = _read_meta(meta) if have else {}
    headers = {"User-Agent": f"variant-studio/{__version__}", "Accept-Encoding": "identity"}
    validator = known.get("etag") if str(known.get("etag", "")).startswith('"') \
        else known.get("last_modified")  # If-Range wants a strong ETag or a date
    if have and validator:
        headers["Range"] = f"bytes={have}-"
        headers["If-Range"] = validator
    elif have:  # nothing to tell a changed resource from the same one: start over
        part.unlink()
        have = 0
    host = urllib.parse.urlsplit(url).hostname
    try:
        response = _opener().open(urllib.request.Request(url, headers=headers),
                                  timeout=TIMEOUT)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and have:  # the partial does not fit the resource: start over
            part.unlink()
            raise _Dropped("the kept partial file did not match; starting over") from None
        if exc.code in (408, 429, 500, 502, 503, 504):
            raise _Dropped(f"HTTP {exc.code} {exc.reason}") from None
        raise DownloadError(f"{host}: HTTP {exc.code} {printable(str(exc.reason), 120)}"
                            f" for {printable(url, 200)}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"cannot download from {host}: "
                            f"{printable(str(reason), 160)}") from None
    with response:
        status = response.status
        length = _int(response.headers.get("Content-Length"))
        if status == 206 and have:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != have:
                part.unlink()
                raise _Dropped("the server resumed at another offset; starting over")
            total = None if match.group(3) == "*" else int(match.group(3))
            mode = "ab"
        elif status == 200:
            have, total, mode = 0, length, "wb"  # a full answer: the resource changed
        else:
            raise DownloadError(f"{host}: unexpected HTTP {status} for {printable(url, 200)}")
        if total is not None and total > limit:
            raise RefusedError(f"{printable(url, 200)} is {total} bytes, more than a "
                               f"download may be ({limit} bytes)")
        if total is not None:
            free = shutil.disk_usage(part.parent).free
            if total - have > free:
                raise RefusedError(f"not enough disk space: {total - have} bytes needed, "
                                   f"{free} free in {part.parent}")
        info = {"url": url, "etag": response.headers.get("ETag"),
                "last_modified": response.headers.get("Last-Modified"), "size": total}
        write_json_atomic(meta, info)
        done = have
        with open(part, mode) as out:
            while True:
                if cancelled():
                    raise Cancelled(f"download of {part.name[:-5]} was cancelled")
                try:
                    chunk = response.read(CHUNK)
                except (http.client.HTTPException, OSError) as exc:  # timeouts are OSErrors
                    raise _Dropped(str(exc) or type(exc).__name__, total) from None
                if not chunk:
                    break
                done += len(chunk)
                if done > limit or (total is not None and done > total):
                    raise RefusedError(f"{printable(url, 200)} sent more than "
                                       f"{total if total is not None else limit} bytes")
                out.write(chunk)
                if progress:
                    progress(done, total or done)
        if total is not None and done < total:
            raise _Dropped(f"connection closed at {done} of {total} bytes", total)
        return info


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _fetch_hf(source: Source, kind: str, folder: Path, progress: digest.Progress | None,
              cancelled: digest.CancelCheck) -> Fetched:
    """The repo's file(s) through huggingface_hub, pinned to one commit: the first
    file's metadata resolves the revision, every file is fetched at that commit."""
    # No telemetry: it would ask the hub for its agent registry and write it under
    # HF_HOME, outside the data directory. (The constant too: the library may have been
    # imported already, and it reads the environment once.)
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        import huggingface_hub
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    except ImportError:  # pragma: no cover - a dependency of the app
        raise DownloadError("huggingface_hub is not installed (run ./run.sh)") from None
    huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY = True
    assert source.repo is not None
    # Read now, not at import: HF_ENDPOINT points the library at another hub (tests use
    # a local one). A token is sent only when HF_TOKEN is set: never one found on disk.
    endpoint = os.environ.get("HF_ENDPOINT") or None
    token: str | bool = os.environ.get("HF_TOKEN") or False
    files = source.files()
    revision = source.revision or "main"
    try:
        metas = []
        commit: str | None = None
        for name in files:
            meta = get_hf_file_metadata(
                hf_hub_url(source.repo, name, revision=commit or revision, endpoint=endpoint),
                token=token, endpoint=endpoint)
            commit = commit or meta.commit_hash
            metas.append(meta)
        sizes = [m.size or 0 for m in metas]
        if sum(sizes) > MAX_BYTES[kind]:
            raise RefusedError(f"{source.repo}: {sum(sizes)} bytes, more than a download may "
                               f"be ({MAX_BYTES[kind]} bytes)")
        folder.mkdir(parents=True, exist_ok=True)
        if sum(sizes) > shutil.disk_usage(folder).free:
            raise RefusedError(f"not enough disk space for {sum(sizes)} bytes in {folder}")
        got = []
        for index, name in enumerate(files):
            bar = _bar_class(progress, cancelled, sum(sizes[:index]), sum(sizes) or 1)
            got.append(Path(hf_hub_download(
                source.repo, name, revision=commit or revision, local_dir=folder,
                cache_dir=paths.cache_dir() / "huggingface", endpoint=endpoint, token=token,
                tqdm_class=bar)))  # type: ignore[arg-type]
            if cancelled():
                raise Cancelled(f"download of {name} was cancelled")
    except StudioError:
        raise
    except Exception as exc:  # not found, the hub unreachable, a broken transfer
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DownloadError(f"{source.repo}: {printable(line, 200)}") from None
    path = got[0].parent if len(files) > 1 else got[0]  # a PEFT pair: its folder
    record = {"repo": source.repo, "files": list(files), "revision": revision,
              "commit": commit, "size": sum(p.stat().st_size for p in got),
              "endpoint": endpoint, "downloaded_at": now_iso()}
    return Fetched(path, got[0], folder, {k: v for k, v in record.items() if v is not None},
                   source.describe(commit))


def _bar_class(progress: digest.Progress | None, cancelled: digest.CancelCheck, offset: int,
               total: int) -> Callable[..., Any]:
    """A tqdm stand-in for huggingface_hub: progress over all files, and the cancel
    check at every chunk (raising there stops the transfer; the library removes its
    temporary file)."""

    class Bar:
        def __init__(self, *_args: Any, initial: int = 0, **_kwargs: Any) -> None:
            self.n = initial

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *_exc: Any) -> None:
            return None

        def update(self, n: int = 1) -> None:
            if cancelled():
                raise Cancelled("download cancelled")
            self.n += n
            if progress:
                progress(min(offset + self.n, total), total)

        def close(self) -> None:
            return None

    return Bar


# --------------------------------------------------------------------------- importing


def verify_sha256(path: Path, expected: str | None, progress: digest.Progress | None = None,
                  cancelled: digest.CancelCheck | None = None, remember: bool = False
                  ) -> str | None:
    """Refuse `path` unless its sha256 is `expected` (nothing to check: None).
    `remember` keeps the digest in the cache (a model file that stays where it is)."""
    if expected is None:
        return None
    if path.is_dir():
        raise UsageError("--sha256 checks one file; this is a folder")
    found = (digest.sha256_file(path, progress, cancelled) if remember
             else digest.hash_uncached(path, progress, cancelled)[0])
    if found != expected:
        raise RefusedError(f"{path.name}: sha256 {found} does not match the expected "
                           f"{expected}; nothing was added")
    return found


def download_model(catalog: Catalog, name: str, source: Source, backend: str | None = None,
                   progress: digest.Progress | None = None,
                   cancelled: digest.CancelCheck | None = None, stage: Stage | None = None,
                   retries: int = RETRIES) -> dict[str, Any]:
    """Download a GGUF base model into `<data>/models/NAME/` and add it (the same
    inspection and hashing as `add_model`). Refusal, cancel or failure adds nothing."""
    catalog.check_store_free(name)  # before a byte is fetched
    if backend not in (None, "llama"):
        raise UsageError("a download is one file, a GGUF model for llama.cpp (an OpenVINO "
                         "model is a folder: fetch it yourself and add it with --file)")
    (stage or _quiet)("downloading")
    fetched = fetch(source, "model", progress, cancelled, retries)
    try:
        (stage or _quiet)("checking")
        verify_sha256(fetched.weights, source.sha256, progress, cancelled, remember=True)
        # Again: another download (the window's, a command's) may have taken the name
        # meanwhile; its folder is refused, never removed.
        catalog.check_store_free(name)
        folder = paths.model_store(name)
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=folder.parent))
        stored = folder / fetched.path.name
        try:
            fetched.path.rename(staging / fetched.path.name)
            staging.rename(folder)
            digest.moved(fetched.path, stored)
            extra = {"download": {**fetched.record,
                                  **({"sha256_checked": True} if source.sha256 else {})}}
            return imports.add_model(catalog, name, stored, "llama", fetched.source,
                                     progress=progress, cancelled=cancelled, extra=extra)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(folder, ignore_errors=True)
            raise
    finally:
        shutil.rmtree(fetched.folder, ignore_errors=True)


def download_adapter(catalog: Catalog, name: str, base: str, source: Source,
                     strict: bool = False, default_scale: float = 1.0,
                     progress: digest.Progress | None = None,
                     cancelled: digest.CancelCheck | None = None, stage: Stage | None = None,
                     retries: int = RETRIES) -> dict[str, Any]:
    """Download an adapter (a GGUF LoRA, a safetensors file, or a PEFT pair from a repo)
    and import it through `imports.add_adapter`: copied, validated against `base` and
    hashed in the store's staging folder. Refusal, cancel or failure adds nothing."""
    paths.check_name(name, "adapter name")
    catalog.check_free(name)
    catalog.model(base)  # an unknown base is refused before a byte is fetched
    validation.require_scale(default_scale, "default scale")
    (stage or _quiet)("downloading")
    fetched = fetch(source, "adapter", progress, cancelled, retries)
    try:
        (stage or _quiet)("checking")
        verify_sha256(fetched.weights, source.sha256, progress, cancelled)
        extra = {"download": {**fetched.record,
                              **({"sha256_checked": True} if source.sha256 else {})}}
        return imports.add_adapter(catalog, name, base, fetched.path, fetched.source,
                                   strict=strict, default_scale=default_scale,
                                   progress=progress, cancelled=cancelled, extra=extra)
    finally:
        shutil.rmtree(fetched.folder, ignore_errors=True)


def _quiet(_stage: str) -> None:
    return None
