"""Identity keys: everything that changes behaviour changes the key; nothing else does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.catalog.identity import AdapterRef, ContextConfig, Identity

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
