"""Adapter signatures (OpenSSF model-signing): keys, the trust list, sign and verify,
the policy at import and at session open (through the real engine process), the
shipped demo against the shipped release key, and what the window shows.

A tampered adapter byte and a tampered provenance record each fail verification and
are refused under `require` both when imported and when the engine opens a session;
at session open the engine is handed each file with its true digest (as if the
catalog had been rewritten with the file), so only its own signature check stands in
the way. An unsigned adapter is refused under `require`, warned about under `warn`
and accepted under `off`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import cli
from engine.catalog import digest, imports
from engine.catalog.resolve import SessionSpec, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.catalog.trust import derived, keys, policy, records, trust_list, verify
from engine.curated import demo, setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from engine.errors import RefusedError
from engine.formats.artifacts import BaseModelInfo
from engine.runtime import messages
from engine.runtime.client import EngineClient
from tests import factories as f

ROOT = Path(__file__).resolve().parents[1]
PROVENANCE = {"format": "variant-studio-provenance/1", "data_sha256": "d" * 64,
              "base_sha256": "b" * 64, "seed": 3, "steps": 2, "init_adapter": None}
TIMEOUT = 300


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def flip_byte(path: Path) -> None:
    """Change one bit of the last weight's lowest byte (a finite weight stays finite)."""
    data = bytearray(path.read_bytes())
    data[-4] ^= 0x01
    path.write_bytes(bytes(data))


def catalog_bytes() -> bytes:
    return Path(os.environ["VARIANT_STUDIO_HOME"], "catalog.json").read_bytes()


@pytest.fixture
def signed_world(studio_home: Path, tmp_path: Path, base_info: BaseModelInfo,
                 capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """A catalog with key `alice`, adapter `a` (with a provenance record) signed by it,
    and its store folder copied out as a signed folder to import elsewhere."""
    catalog = Catalog()
    setup.first_run(catalog)
    assert run(capsys, "key", "create", "alice")[0] == 0
    source = f.write_gguf_lora(tmp_path / "a.gguf", base_info, seed=1, strength=0.1)
    imports.add_adapter(catalog, "a", BASE, source, provenance=PROVENANCE)
    code, out, _ = run(capsys, "sign", "a", "--key", "alice")
    assert code == 0 and "verifies: signed by alice" in out
    shipped = tmp_path / "signed-a"
    shutil.copytree(Path(catalog.adapter("a")["path"]).parent, shipped)
    return {"catalog": catalog, "source": source, "signed": shipped,
            "unsigned": f.write_gguf_lora(tmp_path / "u.gguf", base_info, seed=2,
                                          strength=0.1)}


# --------------------------------------------------------------------------- keys, trust


def test_key_create_is_0600_never_overwrites_and_never_prints_the_key(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "key", "create", "alice")
    assert code == 0, err
    private = studio_home / "keys" / "alice.key"
    secret = private.read_text()
    assert "PRIVATE KEY" in secret
    assert private.stat().st_mode & 0o777 == 0o600
    assert (studio_home / "keys").stat().st_mode & 0o777 == 0o700
    body = "".join(secret.splitlines()[1:-1])
    assert body[:40] not in out + err and "PRIVATE KEY" not in out + err
    # Refused, byte for byte unchanged.
    code, out, err = run(capsys, "key", "create", "alice")
    assert code == 2 and "already exists; not overwriting" in err
    assert private.read_text() == secret
    (studio_home / "keys" / "my key.key").write_text("not ours")  # a stray file is skipped
    code, out, _ = run(capsys, "key", "list", "--json")
    listed = json.loads(out)
    assert [(k["name"], k["mode"], k["trusted"]) for k in listed] == [("alice", "0600", True)]
    # The export is the public key only, and also refuses to overwrite.
    target = tmp_path / "alice.pub"
    assert run(capsys, "key", "export", "alice", "--out", str(target))[0] == 0
    exported = target.read_text()
    assert "PUBLIC KEY" in exported and "PRIVATE" not in exported
    assert exported == (studio_home / "keys" / "alice.pub").read_text()
    assert run(capsys, "key", "export", "alice", "--out", str(target))[0] == 2
    trusted = json.loads(run(capsys, "trust", "list", "--json")[1])
    assert [k["name"] for k in trusted] == ["release", "alice"]
    assert trusted[1]["fingerprint"] == listed[0]["fingerprint"]


def _pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def test_trust_add_refuses_malformed_and_non_ec_keys_and_changes_nothing(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    setup.first_run(Catalog())
    p256 = ec.generate_private_key(ec.SECP256R1())
    cases = {
        "garbage.pub": (b"-----BEGIN PUBLIC KEY-----\nnot base64 at all\n"
                        b"-----END PUBLIC KEY-----\n", "is not a PEM public key"),
        "empty.pub": (b"", "is not a PEM public key"),
        "rsa.pub": (_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)
                         .public_key()), "is an RSA key"),
        "ed.pub": (_pem(ed25519.Ed25519PrivateKey.generate().public_key()),
                   "is an Ed25519 key"),
        "k1.pub": (_pem(ec.generate_private_key(ec.SECP256K1()).public_key()),
                   "on secp256k1"),
        "private.pem": (p256.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()),
                        "holds a private key"),
    }
    for file_name, (data, reason) in cases.items():
        path = tmp_path / file_name
        path.write_bytes(data)
        code, out, err = run(capsys, "trust", "add", str(path))
        assert code == 3, (file_name, out, err)
        assert reason in err and err.count("\n") == 1, (file_name, err)
        assert not (studio_home / "trusted").exists() or not any(
            (studio_home / "trusted").iterdir()), file_name
    good = tmp_path / "bob.pub"
    good.write_bytes(_pem(ec.generate_private_key(ec.SECP384R1()).public_key()))
    code, out, _ = run(capsys, "trust", "add", str(good), "--name", "bob")
    assert code == 0 and out.startswith("trusted bob")
    code, _, err = run(capsys, "trust", "add", str(good), "--name", "bob2")
    assert code == 2 and "already trusted as 'bob'" in err
    code, _, err = run(capsys, "trust", "remove", "release")
    assert code == 3 and "cannot be removed" in err
    assert run(capsys, "trust", "remove", "bob")[0] == 0
    assert [k["name"] for k in json.loads(run(capsys, "trust", "list", "--json")[1])] == [
        "release"]


# --------------------------------------------------------------------------- verify


def test_a_tampered_byte_or_provenance_record_fails_verification(
        signed_world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    catalog = signed_world["catalog"]
    folder = Path(catalog.adapter("a")["path"]).parent
    code, out, _ = run(capsys, "verify", "a", "--json")
    found = json.loads(out)
    assert code == 0 and found["status"] == "valid" and found["signer"] == "alice"
    assert found["files"] == ["adapter.gguf", "provenance.json"]
    shown = json.loads(run(capsys, "show", "a", "--json")[1])
    assert shown["signature"]["status"] == "valid" and shown["signature"]["signer"] == "alice"
    assert {"name": "signature", "status": "pass",
            "detail": found["reason"]} in shown["checks"]

    weights, record = folder / "adapter.gguf", folder / "provenance.json"
    original_weights, original_record = weights.read_bytes(), record.read_bytes()
    flip_byte(weights)
    code, out, _ = run(capsys, "verify", "a", "--json")
    found = json.loads(out)
    assert code == 3 and found["status"] == "invalid"
    assert found["reason"] == "adapter.gguf changed since it was signed"
    shown = json.loads(run(capsys, "show", "a", "--json")[1])
    assert shown["signature"]["status"] == "invalid"  # the display cache keys on content
    weights.write_bytes(original_weights)

    record.write_text(original_record.decode().replace('"seed": 3', '"seed": 4'))
    found = json.loads(run(capsys, "verify", "a", "--json")[1])
    assert found["status"] == "invalid"
    assert found["reason"] == "provenance.json changed since it was signed"
    record.write_bytes(original_record)
    assert json.loads(run(capsys, "verify", "a", "--json")[1])["status"] == "valid"

    # The catalog's own copy of the record must be the signed one too.
    def rewrite(data: dict) -> dict:
        data["adapters"]["a"]["provenance"]["seed"] = 5
        return data

    catalog.state.update(rewrite)
    found = json.loads(run(capsys, "verify", "a", "--json")[1])
    assert found["status"] == "invalid" and "catalog's provenance record differs" in found[
        "reason"]


def test_a_provenance_record_added_after_signing_is_not_covered(
        studio_home: Path, tmp_path: Path, base_info: BaseModelInfo,
        capsys: pytest.CaptureFixture[str]) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    keys.create_key("alice")
    imports.add_adapter(catalog, "b", BASE, f.write_gguf_lora(tmp_path / "b.gguf", base_info,
                                                              seed=1, strength=0.1))
    assert records.sign_adapter(catalog, "b", "alice").files == ("adapter.gguf",)
    (Path(catalog.adapter("b")["path"]).parent / "provenance.json").write_text("{}")
    verdict = records.verify_adapter(catalog, "b")
    assert verdict.status == "invalid" and "provenance.json not covered" in verdict.reason
    # A key that is not (or no longer) trusted does not make a valid signature.
    (Path(catalog.adapter("b")["path"]).parent / "provenance.json").unlink()
    assert records.verify_adapter(catalog, "b").ok
    trust_list.trust_remove("alice")
    verdict = records.verify_adapter(catalog, "b")
    assert verdict.status == "invalid" and "not trusted here" in verdict.reason


def test_the_demo_verifies_against_the_shipped_release_key(
        studio_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    release = [k for k in trust_list.trusted_keys() if k.shipped]
    assert [k.name for k in release] == ["release"]
    shipped = verify.verify_folder(demo.resources_dir(), release)
    assert shipped.ok and shipped.files == ("adapter.gguf", "provenance.json")
    setup.first_run(Catalog(), with_demo=True)
    found = json.loads(run(capsys, "verify", demo.ADAPTER_NAME, "--json")[1])
    assert (found["status"], found["signer"], found["required"]) == ("valid", "release", True)
    # The release private key is not in the repository.
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert "resources/keys/release.pub" in tracked
    for name in tracked:
        path = ROOT / name
        if path.suffix in (".key", ".pem", ".pub", ".sig") and path.is_file():
            assert b"PRIVATE KEY" not in path.read_bytes(), name
    # A changed copy of the shipped demo is not signed by the release key any more.
    copy = tmp_path / "demo"
    shutil.copytree(demo.resources_dir(), copy, ignore=shutil.ignore_patterns("*.jsonl"))
    flip_byte(copy / "adapter.gguf")
    assert not verify.verify_folder(copy, release).ok


def test_a_tampered_curated_demo_is_not_seeded(studio_home: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "demo"
    shutil.copytree(demo.resources_dir(), copy)
    record = json.loads((copy / "provenance.json").read_text())
    record["seed"] = 8  # the adapter still matches the record; the signature does not
    (copy / "provenance.json").write_text(json.dumps(record))
    monkeypatch.setattr(demo, "resources_dir", lambda: copy)
    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    assert demo.ADAPTER_NAME not in catalog.data()["adapters"]
    from engine.state.statefile import take_notices

    notes = take_notices()
    assert any("curated adapter tool-calls-lora: provenance.json changed since it was "
               "signed" in n for n in notes), notes


def test_a_converted_file_is_covered_by_re_deriving_it(
        signed_world: dict[str, Any], tmp_path: Path, base_info: BaseModelInfo) -> None:
    from engine.formats import lora_io

    catalog = signed_world["catalog"]
    record = catalog.adapter("a")
    source = records.verify_adapter(catalog, "a")
    derivation = derived.Derivation(record["path"], record["sha256"], base_info.head_count,
                                    base_info.head_count_kv, "llama", ("x" * 64, "y" * 64))
    served = lora_io.convert_file(Path(record["path"]), tmp_path / "peft",
                                  lora_io.Layout.of("llama", base_info.head_count,
                                                    base_info.head_count_kv),
                                  rebase=derivation.rebase)
    weights, config = served / "adapter_model.safetensors", served / "adapter_config.json"

    def check() -> verify.Verdict:
        return derived.verify_derived(weights, digest.hash_uncached(weights)[0],
                                      digest.hash_uncached(config)[0], derivation, source)

    verdict = check()
    assert verdict.ok and verdict.derived and verdict.signer == "alice"
    flip_byte(weights)
    verdict = check()
    assert verdict.status == "invalid" and "converting it again gives other bytes" in \
        verdict.reason


# --------------------------------------------------------------------------- imports


def test_the_import_policy(signed_world: dict[str, Any],
                           capsys: pytest.CaptureFixture[str]) -> None:
    home = Path(os.environ["VARIANT_STUDIO_HOME"])
    signed, unsigned = signed_world["signed"], signed_world["unsigned"]

    def add(name: str, file: Path) -> tuple[int, str, str]:
        return run(capsys, "adapter", "add", name, "--base", BASE, "--file", str(file))

    # off: accepted, nothing said; a signature that arrives is kept and reported.
    code, out, err = add("u-off", unsigned)
    assert code == 0 and "signature" not in out + err
    code, out, _ = add("s-off", signed / "adapter.gguf")
    assert code == 0
    found = json.loads(run(capsys, "verify", "s-off", "--json")[1])
    assert found["status"] == "valid" and found["signer"] == "alice"
    record = Catalog().adapter("s-off")
    assert record["provenance"] == PROVENANCE and record["signature"]["key"] == "alice"

    assert run(capsys, "policy", "set", "warn")[0] == 0
    code, out, err = add("u-warn", unsigned)
    assert code == 0 and "! signature: no signature.sig" in out and "(policy warn)" in out

    assert run(capsys, "policy", "set", "require")[0] == 0
    assert json.loads(run(capsys, "policy", "show", "--json")[1])["policy"] == "require"
    tampered_byte = signed.parent / "tampered-byte"
    shutil.copytree(signed, tampered_byte)
    flip_byte(tampered_byte / "adapter.gguf")
    tampered_record = signed.parent / "tampered-record"
    shutil.copytree(signed, tampered_record)
    text = (tampered_record / "provenance.json").read_text()
    (tampered_record / "provenance.json").write_text(text.replace('"seed": 3', '"seed": 9'))
    refusals = {
        "u-req": (unsigned, "no signature.sig: the adapter is not signed"),
        "t-byte": (tampered_byte / "adapter.gguf", "adapter.gguf changed since it was signed"),
        "t-rec": (tampered_record / "adapter.gguf",
                  "provenance.json changed since it was signed"),
    }
    for name, (file, reason) in refusals.items():
        before = catalog_bytes()
        code, out, err = add(name, file)
        assert code == 3, (name, out, err)
        assert f"adapter {name} refused by the signature policy (require): {reason}" in err
        assert catalog_bytes() == before, name
        assert not (home / "adapters" / name).exists(), name
        assert not [p for p in (home / "adapters").iterdir() if p.name.startswith(".import")]
    code, out, err = add("s-req", signed / "adapter.gguf")
    assert code == 0, err
    # Another machine's key: refused until it is trusted.
    trust_list.trust_remove("alice")
    code, _, err = add("s-untrusted", signed / "adapter.gguf")
    assert code == 3 and "signed by a key that is not trusted here" in err


def test_training_is_refused_up_front_under_require(studio_home: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    policy.set_policy(catalog, "require")
    data = f.sft_data(tmp_path / "data.jsonl")
    code, _, err = run(capsys, "train", "t", "--base", BASE, "--data", str(data))
    assert code == 3 and "newly trained adapter is unsigned" in err


# --------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def engine_world(module_home: Path, tmp_path_factory: pytest.TempPathFactory,
                 base_info: BaseModelInfo) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("signature-engine")
    catalog = Catalog()
    setup.first_run(catalog)
    keys.create_key("alice")
    imports.add_adapter(catalog, "signed", BASE, f.write_gguf_lora(
        tmp / "s.gguf", base_info, seed=1, strength=0.1), provenance=PROVENANCE)
    records.sign_adapter(catalog, "signed", "alice")
    imports.add_adapter(catalog, "plain", BASE, f.write_gguf_lora(
        tmp / "p.gguf", base_info, seed=2, strength=0.1))
    catalog.add_variant("v-signed", BASE, [AdapterSpec("signed", 1.0)])
    catalog.add_variant("v-plain", BASE, [AdapterSpec("plain", 1.0)])
    client = EngineClient()
    try:
        yield {"catalog": catalog, "client": client}
    finally:
        client.close()


def open_session(world: dict[str, Any], spec: SessionSpec) -> dict[str, Any]:
    return world["client"].call(messages.Open(spec), timeout=TIMEOUT)


def with_true_digest(spec: SessionSpec) -> SessionSpec:
    """`spec` with each adapter's digest recomputed (the catalog rewritten to match)."""
    adapters = tuple(dataclasses.replace(a, sha256=digest.hash_uncached(Path(a.path))[0])
                     for a in spec.adapters)
    return dataclasses.replace(spec, adapters=adapters)


def test_the_engine_checks_signatures_when_a_session_opens(
        engine_world: dict[str, Any]) -> None:
    world, catalog = engine_world, engine_world["catalog"]
    client = world["client"]
    # off: both open (the unsigned one first: its warm session matters below).
    open_session(world, resolve(catalog, "v-plain"))
    pid = client.pid
    policy.set_policy(catalog, "require")
    spec = resolve(catalog, "v-signed")
    assert spec.policy == "require" and spec.adapters[0].signing is not None
    assert [k.name for k in spec.trusted] == ["release", "alice"]
    opened = time.perf_counter()
    open_session(world, spec)
    first = time.perf_counter() - opened
    opened = time.perf_counter()
    open_session(world, spec)  # warm: the verdict comes from the engine's cache
    again = time.perf_counter() - opened
    print(f"session open under require: {first:.3f} s, again {again:.3f} s")
    # require: the unsigned variant is refused, although its session is warm.
    with pytest.raises(RefusedError) as info:
        open_session(world, resolve(catalog, "v-plain"))
    assert "adapter plain: signature required: no signature.sig" in info.value.message
    # warn: served (the engine logs a warning).
    policy.set_policy(catalog, "warn")
    open_session(world, resolve(catalog, "v-plain"))
    # The engine's log reaches the client on its own thread: wait for the line.
    deadline = time.monotonic() + 10
    while not any("warning: adapter plain: no signature.sig" in line
                  for line in client.log_tail(50)):
        assert time.monotonic() < deadline, client.log_tail(50)
        time.sleep(0.02)
    policy.set_policy(catalog, "require")

    folder = Path(catalog.adapter("signed")["path"]).parent
    weights, record = folder / "adapter.gguf", folder / "provenance.json"
    original_weights, original_record = weights.read_bytes(), record.read_bytes()
    try:
        flip_byte(weights)
        with pytest.raises(RefusedError) as info:
            open_session(world, with_true_digest(resolve(catalog, "v-signed")))
        assert ("adapter signed: signature invalid: adapter.gguf changed since it was "
                "signed") in info.value.message
        weights.write_bytes(original_weights)
        record.write_text(original_record.decode().replace('"seed": 3', '"seed": 4'))
        with pytest.raises(RefusedError) as info:
            open_session(world, resolve(catalog, "v-signed"))
        assert ("adapter signed: signature invalid: provenance.json changed since it was "
                "signed") in info.value.message
    finally:
        weights.write_bytes(original_weights)
        record.write_bytes(original_record)
    open_session(world, resolve(catalog, "v-signed"))
    assert client.pid == pid and client.state == "running"


# --------------------------------------------------------------------------- the window


def test_the_window_shows_the_signature_badge_row_and_the_lineage(
        window: Any, qtbot: Any) -> None:
    from gui.library import BadgesRole

    window.library.select(demo.ADAPTER_NAME)
    model = window.library.model
    qtbot.waitUntil(lambda: "signed · release" in (
        model.index_of(demo.ADAPTER_NAME).data(BadgesRole) or ()), timeout=10_000)
    html = window.detail.browser.toHtml()
    assert "signature" in html and "valid: signed by release" in html
    assert window.detail.buttons["lineage"].isVisible()
    from gui.lineage import LineageDialog

    with qtbot.waitSignal(window.detail.lineageRequested, timeout=5_000):
        window.detail.buttons["lineage"].click()
    dialogs = window.findChildren(LineageDialog)
    assert len(dialogs) == 1 and dialogs[0].isVisible()
    rows = dialogs[0].rows()
    assert rows[0][1] == f"adapter {demo.ADAPTER_NAME}"
    labels = [r[1] for r in rows]
    assert f"base: model {BASE}" in labels and "data train.jsonl" in labels
    record = Catalog().adapter(demo.ADAPTER_NAME)
    assert rows[0][2] == record["sha256"]
    assert [r[2] for r in rows if r[1] == "data train.jsonl"] == [
        record["provenance"]["data_sha256"]]


def test_a_demo_seeded_before_signatures_adopts_the_shipped_one(
        studio_home: Path, base_info: BaseModelInfo) -> None:
    from engine.formats import lora_io

    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    record = catalog.adapter(demo.ADAPTER_NAME)
    folder = Path(record["path"]).parent
    (folder / verify.SIGNATURE_FILE).unlink()
    # Its OpenVINO file as an older conversion left it: no record of how it was made.
    target_sha = "f" * 64
    peft = lora_io.convert_file(Path(record["path"]), studio_home / "adapters" /
                                demo.ADAPTER_NAME / "openvino",
                                lora_io.Layout.of("llama", base_info.head_count,
                                                  base_info.head_count_kv),
                                rebase=(record["base_sha256"], target_sha))
    entry = {"backend": "openvino", "format": "peft", "base": "ov", "base_sha256": target_sha,
             "path": str(peft / "adapter_model.safetensors"),
             "sha256": digest.hash_uncached(peft / "adapter_model.safetensors")[0],
             "config_sha256": digest.hash_uncached(peft / "adapter_config.json")[0]}

    def attach(data: dict) -> dict:
        data["adapters"][demo.ADAPTER_NAME]["files"] = {"openvino": entry}
        return data

    catalog.state.update(attach)
    assert records.verify_adapter(catalog, demo.ADAPTER_NAME).status == "unsigned"
    assert records.verify_backend_file(catalog, demo.ADAPTER_NAME, "openvino").status \
        == "unsigned"
    setup.first_run(catalog)  # the next start
    assert records.verify_adapter(catalog, demo.ADAPTER_NAME).ok
    converted = records.verify_backend_file(catalog, demo.ADAPTER_NAME, "openvino")
    assert converted.ok and converted.derived and converted.signer == "release"
    # Stored bytes that are not the signed ones get no signature.
    (folder / verify.SIGNATURE_FILE).unlink()
    flip_byte(folder / "adapter.gguf")
    assert not demo.adopt_signature(catalog)
    assert not (folder / verify.SIGNATURE_FILE).exists()


def test_a_signature_made_for_other_file_names_says_so(
        studio_home: Path, tmp_path: Path, base_info: BaseModelInfo,
        capsys: pytest.CaptureFixture[str]) -> None:
    catalog = Catalog()
    setup.first_run(catalog)
    keys.create_key("alice")
    folder = tmp_path / "download"
    folder.mkdir()
    f.write_gguf_lora(folder / "style.gguf", base_info, seed=1, strength=0.1)
    # model-signing over a folder whose weights are not named as in the store.
    from model_signing import signing

    signing.Config().use_elliptic_key_signer(
        private_key=keys.private_key_path("alice")).sign(folder, folder / "x.sig")
    (folder / "x.sig").rename(folder / verify.SIGNATURE_FILE)
    policy.set_policy(catalog, "require")
    before = catalog_bytes()
    code, _, err = run(capsys, "adapter", "add", "style", "--base", BASE, "--file",
                       str(folder / "style.gguf"))
    assert code == 3 and "it signs style.gguf, which a stored adapter does not have; " \
        "adapter.gguf not covered by the signature" in err, err
    assert catalog_bytes() == before
