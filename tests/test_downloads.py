"""Downloads of models and adapters from a URL or a Hugging Face repository, served by
a local HTTP server on the loopback address (tests/download_server.py; these machines
reach no hub): the same validation as an import, provenance in the record, resume
after a dropped connection, and nothing left behind by a cancel, a wrong --sha256 or a
refusal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engine import cli
from engine.catalog import downloads
from engine.catalog.store import Catalog
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.errors import Cancelled
from tests import factories as f
from tests.download_server import COMMIT, FileServer, left_behind, serving

URL_PATH = "loras/poet.gguf"


@pytest.fixture
def lora(tmp_path: Path, base_info) -> bytes:  # noqa: ANN001
    return f.write_gguf_lora(tmp_path / "poet.gguf", base_info, seed=3, strength=0.1
                             ).read_bytes()


@pytest.fixture
def server(lora: bytes, tmp_path: Path, base_info):  # noqa: ANN001, ANN201
    peft = f.write_peft_lora(tmp_path / "peft", base_info, seed=4)
    files = FileServer(files={URL_PATH: lora},
                       repos={"org/poet": {"poet.gguf": lora},
                              "org/peft": {p.name: p.read_bytes() for p in peft.iterdir()}})
    with serving(files) as running:
        yield running


@pytest.fixture
def hub(server: FileServer, monkeypatch: pytest.MonkeyPatch) -> FileServer:
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    return server


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_adapter_by_url_resumes_a_dropped_connection(studio_home: Path, server: FileServer,
                                                        lora: bytes,
                                                        capsys: pytest.CaptureFixture) -> None:
    server.drop_after[URL_PATH] = 300_000  # the first answer breaks off there
    code, out, err = run(capsys, "adapter", "add", "poet", "--base", BASE,
                         "--url", server.url(URL_PATH))
    assert code == 0, err
    assert "added adapter poet" in out
    first, second = server.requests(URL_PATH)
    assert first.range is None
    # Resumed where the connection dropped, only if the file is still the same one.
    assert second.range == "bytes=300000-"
    assert second.if_range == f'"{hashlib.sha256(lora).hexdigest()}"'
    record = Catalog().adapter("poet")
    assert record["sha256"] == hashlib.sha256(lora).hexdigest()
    assert Path(record["path"]).read_bytes() == lora  # the stored copy, whole
    assert record["source"] == server.url(URL_PATH)
    assert record["download"]["url"] == server.url(URL_PATH)
    assert record["download"]["file"] == "poet.gguf"
    assert {c["name"]: c["status"] for c in record["checks"]}["coverage"] == "pass"
    # Imported: the record and its store folder, no partial or copy left in the cache.
    assert left_behind(studio_home, "poet") == ["record adapters/poet",
                                               str(studio_home / "adapters" / "poet")]
    code, out, _ = run(capsys, "show", "poet")
    assert code == 0 and f"downloaded: {server.url(URL_PATH)} on " in out


def test_an_adapter_by_hugging_face_repo_id_records_the_commit(
        studio_home: Path, hub: FileServer, lora: bytes, capsys: pytest.CaptureFixture) -> None:
    sha = hashlib.sha256(lora).hexdigest()
    code, out, err = run(capsys, "adapter", "add", "poet", "--base", BASE, "--hf", "org/poet",
                         "--filename", "poet.gguf", "--revision", "main", "--sha256",
                         sha.upper())
    assert code == 0, err
    record = Catalog().adapter("poet")
    assert record["sha256"] == sha
    assert record["download"]["repo"] == "org/poet"
    assert record["download"]["revision"] == "main"
    assert record["download"]["commit"] == COMMIT
    assert record["download"]["sha256_checked"] is True
    assert record["source"] == f"Hugging Face org/poet: poet.gguf at main, commit {COMMIT}"
    # The revision is resolved once, then the file is fetched at that commit.
    fetched = [(r.method, r.path) for r in hub.log if "/resolve/" in r.path]
    assert ("HEAD", "/org/poet/resolve/main/poet.gguf") in fetched
    assert fetched[-1] == ("GET", f"/org/poet/resolve/{COMMIT}/poet.gguf")
    assert left_behind(studio_home, "poet") == ["record adapters/poet",
                                               str(studio_home / "adapters" / "poet")]
    shown = json.loads(run(capsys, "show", "poet", "--json")[1])
    assert shown["download"]["commit"] == COMMIT


def test_a_peft_pair_comes_from_one_commit(studio_home: Path, hub: FileServer) -> None:
    source = downloads.Source.parse("adapter", repo="org/peft")
    fetched = downloads.fetch(source, "adapter")
    assert fetched.path.is_dir() and fetched.weights.name == "adapter_model.safetensors"
    for name in downloads.PEFT_FILES:
        assert (fetched.path / name).read_bytes() == hub.repos["org/peft"][name]
        assert ("GET", f"/org/peft/resolve/{COMMIT}/{name}") in [
            (r.method, r.path) for r in hub.log]
    assert fetched.record["files"] == list(downloads.PEFT_FILES)
    downloads.discard(source, "adapter")
    assert not fetched.folder.exists()


def test_a_cancelled_download_leaves_nothing(studio_home: Path, server: FileServer) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    before = catalog.data()
    seen: list[int] = []
    source = downloads.Source.parse("adapter", url=server.url(URL_PATH))
    with pytest.raises(Cancelled):
        downloads.download_adapter(catalog, "poet", BASE, source,
                                   progress=lambda done, _total: seen.append(done),
                                   cancelled=lambda: bool(seen))  # after the first chunk
    assert seen and seen[0] < len(server.files[URL_PATH])  # it stopped part way
    assert catalog.data() == before
    assert left_behind(studio_home, "poet") == []
    assert downloads.partial_files(source, "adapter") == []


def test_a_wrong_sha256_leaves_nothing(studio_home: Path, server: FileServer,
                                       capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "adapter", "add", "poet", "--base", BASE,
                       "--url", server.url(URL_PATH), "--sha256", "0" * 64)
    assert code == 3 and "does not match the expected " + "0" * 64 in err
    assert len(err.strip().splitlines()) == 1
    assert left_behind(studio_home, "poet") == []


def test_a_failed_download_keeps_its_partial_outside_the_store_and_resumes(
        studio_home: Path, server: FileServer, lora: bytes,
        capsys: pytest.CaptureFixture) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    source = downloads.Source.parse("adapter", url=server.url(URL_PATH))
    server.drop_after[URL_PATH] = 500_000
    with pytest.raises(downloads.DownloadError, match="run it again to resume"):
        downloads.download_adapter(catalog, "poet", BASE, source, retries=0)
    (partial,) = downloads.partial_files(source, "adapter")
    assert partial.stat().st_size == 500_000
    assert partial.is_relative_to(studio_home / "cache")  # not in the store
    assert "poet" not in catalog.data()["adapters"]
    assert not (studio_home / "adapters" / "poet").exists()
    # The same command again resumes it.
    code, _, err = run(capsys, "adapter", "add", "poet", "--base", BASE,
                       "--url", server.url(URL_PATH))
    assert code == 0, err
    assert server.requests(URL_PATH)[-1].range == "bytes=500000-"
    assert Path(Catalog().adapter("poet")["path"]).read_bytes() == lora
    assert downloads.partial_files(source, "adapter") == []


def test_a_base_model_by_url_lives_in_the_store_until_removed(
        studio_home: Path, embedded_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = embedded_path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    with serving(FileServer(files={"models/smol.gguf": data})) as files:
        code, out, err = run(capsys, "model", "add", "mine", "--url",
                             files.url("models/smol.gguf"), "--sha256", sha)
    assert code == 0, err
    record = Catalog().model("mine")
    stored = studio_home / "models" / "mine" / "smol.gguf"
    assert record["path"] == str(stored) and stored.read_bytes() == data
    assert record["sha256"] == sha and record["source"] == files.url("models/smol.gguf")
    assert record["download"]["sha256_checked"] is True
    assert run(capsys, "remove", "mine")[0] == 0
    assert not (studio_home / "models" / "mine").exists()


def test_a_store_folder_without_a_record_is_refused_never_removed(
        studio_home: Path, embedded_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = studio_home / "models" / "mine"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("someone's")
    with serving(FileServer(files={"models/smol.gguf": embedded_path.read_bytes()})) as files:
        code, _, err = run(capsys, "model", "add", "mine", "--url",
                           files.url("models/smol.gguf"))
    assert code != 0 and "already exists without a catalog record" in err
    assert (folder / "notes.txt").read_text() == "someone's"
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert "mine" not in Catalog().data()["models"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--url", "file:///etc/passwd"], "not an http(s) URL"),
    (["--url", "http://me:secret@example.org/a.gguf"], "user name or password"),
    (["--url", "http://example.org/a.gguf", "--filename", "a.gguf"], "go with --hf"),
    (["--hf", "../evil"], "invalid Hugging Face repo id"),
    (["--hf", "org/repo", "--filename", "../a.gguf"], "invalid file name"),
    (["--hf", "org/repo", "--revision", "../main"], "invalid revision"),
    (["--hf", "org/repo", "--sha256", "abc"], "64 hexadecimal digits"),
    (["--file", "x.gguf", "--url", "http://example.org/a.gguf"], "not allowed with"),
])
def test_bad_download_flags_are_one_line_usage_errors(studio_home: Path, argv: list[str],
                                                      message: str,
                                                      capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "adapter", "add", "x", "--base", BASE, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert "x" not in Catalog().data()["adapters"]


def test_a_model_from_a_repo_needs_its_file_name_and_a_missing_file_fails(
        studio_home: Path, hub: FileServer, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "model", "add", "m", "--hf", "org/poet")
    assert code == 2 and "needs its file name" in err
    code, _, err = run(capsys, "adapter", "add", "x", "--base", BASE, "--hf", "org/poet",
                       "--filename", "missing.gguf")
    assert code == downloads.DownloadError.exit_code and err.startswith("error: org/poet: ")
    assert left_behind(studio_home, "x") == []
    code, _, err = run(capsys, "adapter", "add", "x", "--base", BASE,
                       "--url", hub.url("nothing/here.gguf"))
    assert code == downloads.DownloadError.exit_code and "HTTP 404" in err
    assert left_behind(studio_home, "x") == []


def test_the_file_name_comes_from_the_url_checked_or_is_fixed() -> None:
    assert downloads.url_file_name("http://h/a/poet.gguf?x=1", "adapter") == "poet.gguf"
    assert downloads.url_file_name("http://h/a/..%2F..%2Fetc", "adapter") == "adapter.gguf"
    assert downloads.url_file_name("http://h/", "model") == "model.gguf"
    assert downloads.url_file_name("http://h/.hidden", "model") == "model.gguf"
