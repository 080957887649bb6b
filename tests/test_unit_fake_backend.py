"""The unit tier's fake backend itself: selected only through the test hook, refusing
any file but its own base, and numbers that move with what the tests assert on (the
adapters and their scales, and how the cache was filled)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.catalog.resolve import resolve
from engine.catalog.store import Catalog
from engine.errors import RefusedError
from engine.formats import artifacts
from engine.runtime import backend
from engine.runtime.adapters import AdapterManager
from engine.runtime.sampler import log_softmax
from tests import fake_backend as fb

pytestmark = pytest.mark.unit

PROMPT = fb.tokenize("<|im_start|>user\n" + "Waves under a grey sky. " * 8 + "<|im_end|>\n",
                     add_special=False)


def model_of(fake: fb.FakeBackend, catalog: Catalog) -> fb.FakeModel:
    spec = resolve(catalog, fb.BASE)
    model = backend.load_model("llama", spec.base_path, spec.identity.served_sha256, 1, None,
                               lambda: False)
    assert isinstance(model, fb.FakeModel) and fake.models == [model]
    return model


def test_the_hook_holds_the_fake_only_while_installed() -> None:
    assert backend.TEST_LOADERS == {}
    with fb.install() as fake:
        assert {"llama": fake} == backend.TEST_LOADERS
    assert backend.TEST_LOADERS == {}


def test_the_fake_refuses_every_file_but_its_own_base(fake: fb.FakeBackend,
                                                      tmp_path: Path) -> None:
    other = fb.write_base(tmp_path / "other.gguf", name="Some real model")
    with pytest.raises(RefusedError, match="serves only its own base"):
        backend.load_model("llama", str(other), "0" * 64, 1, None, lambda: False)
    assert fake.models == []


def test_adapters_and_their_scales_move_the_logits(fake: fb.FakeBackend,
                                                   fake_catalog: Catalog) -> None:
    model = model_of(fake, fake_catalog)
    info = artifacts.inspect_path(Path(model.path))
    assert isinstance(info, artifacts.BaseModelInfo) and info.vocab_size == fb.N_VOCAB

    def last_logits(variant: str | None) -> np.ndarray:
        adapters = AdapterManager().verify(resolve(fake_catalog, variant), info) \
            if variant else []
        return model.new_context(adapters, 4096, 64).prefill(PROMPT)

    base, full, half, zero = (last_logits(v) for v in (None, "va", "va-half", "va0"))
    assert np.array_equal(zero, base)
    assert not np.allclose(full, base) and not np.allclose(half, full)
    # Linear in the scale: half the step of the full one.
    np.testing.assert_allclose(half - base, (full - base) / 2, atol=1e-4)


def test_the_logits_depend_on_how_the_cache_was_filled(fake: fb.FakeBackend,
                                                       fake_catalog: Catalog) -> None:
    model = model_of(fake, fake_catalog)
    aligned = [model.new_context([], 4096, 64).prefill(PROMPT) for _ in range(2)]
    other_chunks = model.new_context([], 4096, 16).prefill(PROMPT)
    assert np.array_equal(aligned[0], aligned[1])  # deterministic
    assert not np.array_equal(other_chunks, aligned[0])  # ...but not batch-blind
    assert np.argmax(other_chunks) == np.argmax(aligned[0])
    assert np.max(np.abs(log_softmax(other_chunks) - log_softmax(aligned[0]))) < 1e-2


def test_tokenize_parses_special_tokens_only_when_asked() -> None:
    text = "<|im_start|>Hi!"
    assert fb.tokenize(text, add_special=True) == [fb.BOS, fb.IM_START, *(
        fb.token_id(c) for c in "Hi!")]
    plain = fb.tokenize(text, add_special=False, parse_special=False)
    assert len(plain) == len(text) and fb.IM_START not in plain
    assert b"".join(fb.piece(t) for t in plain).decode() == text
    assert fb.tokenize("é", add_special=False) == [fb.UNK]
