"""Identity keys: everything that changes behaviour changes the key (and, on purpose, the
names of the base and adapters served); nothing else does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.catalog import imports, resolve
from engine.catalog.identity import AdapterRef, ContextConfig, Identity
from engine.catalog.store import AdapterSpec, Catalog
from engine.curated import setup
from engine.curated.embedded import DEFAULT_MODEL_NAME as BASE
from tests import factories as f

A = AdapterRef("a", "a" * 64, 1.0)
B = AdapterRef("b", "b" * 64, 1.0)


def ident(*adapters: AdapterRef, **changes) -> Identity:
    fields = dict(backend="llama", base_name="base", base_sha256="0" * 64, adapters=adapters,
                  chat_template_sha256="c" * 64, bos_policy="add_bos=false;bos=1",
                  runtime="llama-cpp-python/0.3.36", context=ContextConfig())
    fields.update(changes)
    return Identity(**fields)


def test_every_variant_shape_has_its_own_key() -> None:
    keys = {
        "base": ident().key,
        "base+A": ident(A).key,
        "base+B": ident(B).key,
        "base+A@0.5": ident(AdapterRef("a", "a" * 64, 0.5)).key,
        "base+[A,B]": ident(A, B).key,
        "base+[B,A]": ident(B, A).key,
    }
    assert len(set(keys.values())) == len(keys), keys


@pytest.mark.parametrize("change", [
    {"backend": "openvino"},
    {"base_sha256": "1" * 64},
    {"chat_template_sha256": None},
    {"bos_policy": "add_bos=true;bos=1"},
    {"runtime": "llama-cpp-python/0.3.37"},
    {"context": ContextConfig(n_ctx=8192)},
    {"base_name": "the-same-bytes-by-another-name"},  # names: on purpose (identity.py)
])
def test_each_behaviour_field_is_part_of_the_key(change: dict) -> None:
    assert ident(A, **change).key != ident(A).key


def test_equal_inputs_give_equal_keys_and_zero_sign_does_not_matter() -> None:
    assert ident(A).key == ident(AdapterRef("a", "a" * 64, 1)).key
    zero = ident(AdapterRef("a", "a" * 64, 0.0)).key
    assert zero == ident(AdapterRef("a", "a" * 64, -0.0)).key


def test_non_finite_scale_cannot_make_an_identity() -> None:
    with pytest.raises(ValueError):
        AdapterRef("a", "a" * 64, float("nan"))


def test_round_trip_through_dict() -> None:
    value = ident(A, B)
    assert Identity.from_dict(json.loads(json.dumps(value.to_dict()))) == value


def test_same_key_in_another_process() -> None:
    code = (
        "from engine.catalog.identity import *\n"
        "A = AdapterRef('a', 'a' * 64, 1.0); B = AdapterRef('b', 'b' * 64, 1.0)\n"
        "print(Identity('llama', 'base', '0' * 64, (A, B), 'c' * 64, "
        "'add_bos=false;bos=1', 'llama-cpp-python/0.3.36', ContextConfig()).key)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin"})
    assert out.stdout.strip() == ident(A, B).key


# ------------------------------------------------------------ what a catalog puts in it


def _catalog(home: Path, monkeypatch: pytest.MonkeyPatch) -> Catalog:
    monkeypatch.setenv("VARIANT_STUDIO_HOME", str(home))
    return Catalog()


def test_the_key_ignores_what_computes_nothing(tmp_path: Path, embedded_path: Path,
                                               base_info, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    """The same bytes and scales under the same names give the same key, whatever the
    variant is called, where the files lie, where they came from, when they were added,
    and which sampling and system prompt the profile holds (those travel with each
    request: a different system prompt is a different prompt, not a different model)."""
    adapter = f.write_gguf_lora(tmp_path / "a.gguf", base_info, seed=1)
    one = _catalog(tmp_path / "one", monkeypatch)
    setup.first_run(one)
    imports.add_adapter(one, "a", BASE, adapter, source="https://example.org/a")
    one.add_variant("v", BASE, [AdapterSpec("a", 0.5)],
                    {"system_prompt": "Be brief.", "temperature": 0.0, "max_tokens": 5})
    one.add_variant("v-copy", BASE, [AdapterSpec("a", 0.5)])
    # Another data directory: the base registered from a copy elsewhere, the adapter
    # from a renamed copy, another source, another default scale and other sampling.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copyfile(embedded_path, elsewhere / "model.gguf")
    shutil.copyfile(adapter, elsewhere / "renamed.gguf")
    two = _catalog(tmp_path / "two", monkeypatch)
    imports.add_model(two, BASE, elsewhere / "model.gguf", source="a copy")
    imports.add_adapter(two, "a", BASE, elsewhere / "renamed.gguf", source="a copy",
                        default_scale=0.25)
    two.add_variant("other-name", BASE, [AdapterSpec("a", 0.5)],
                    {"system_prompt": "Answer at length.", "temperature": 1.2, "seed": 7})

    keys = {resolve.identity(one, "v").key, resolve.identity(one, "v-copy").key,
            resolve.identity(two, "other-name").key}
    assert len(keys) == 1
    # ...while all of those really differ between the two specs.
    first, second = resolve.resolve(one, "v"), resolve.resolve(two, "other-name")
    assert first.base_path != second.base_path
    assert first.adapters[0].path != second.adapters[0].path
    assert (first.name, first.system_prompt) != (second.name, second.system_prompt)
    assert resolve.sampling(one, "v") != resolve.sampling(two, "other-name")


def test_the_key_covers_bytes_scales_order_context_and_names(
        tmp_path: Path, base_info, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of these changes the key. Names too, on purpose (engine/catalog/identity.py
    says why): the same bytes imported under another name are another identity."""
    catalog = _catalog(tmp_path / "home", monkeypatch)
    setup.first_run(catalog)
    file_a = f.write_gguf_lora(tmp_path / "a.gguf", base_info, seed=1)
    imports.add_adapter(catalog, "a", BASE, file_a)
    imports.add_adapter(catalog, "a-again", BASE, file_a)  # the same bytes
    for name, seed in (("b", 2), ("c", 3)):
        imports.add_adapter(catalog, name, BASE, f.write_gguf_lora(tmp_path / f"{name}.gguf",
                                                                   base_info, seed=seed))
    variants = {
        "reference": [AdapterSpec("a", 1.0), AdapterSpec("b", 1.0)],
        "other-bytes": [AdapterSpec("c", 1.0), AdapterSpec("b", 1.0)],
        "fewer": [AdapterSpec("b", 1.0)],
        "other-scale": [AdapterSpec("a", 0.5), AdapterSpec("b", 1.0)],
        "other-order": [AdapterSpec("b", 1.0), AdapterSpec("a", 1.0)],
        "other-name": [AdapterSpec("a-again", 1.0), AdapterSpec("b", 1.0)],
    }
    for name, parts in variants.items():
        catalog.add_variant(name, BASE, parts)
    catalog.add_variant("other-context", BASE, variants["reference"], {"n_ctx": 8192})
    assert catalog.adapter("a")["sha256"] == catalog.adapter("a-again")["sha256"]
    keys = {name: resolve.identity(catalog, name).key
            for name in (*variants, "other-context")}
    assert len(set(keys.values())) == len(keys), keys
    assert resolve.identity(catalog, BASE, n_ctx=8192).key != resolve.identity(
        catalog, BASE).key
