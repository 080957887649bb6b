"""The session registry in-process on the fake backend: sessions keyed by identity (a
different adapter or scale never shares warm state), warm answers equal to cold ones
through the prefix cache, the session bound, and the adapter manager's count and
eviction."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec, resolve
from engine.catalog.store import Catalog
from engine.errors import RefusedError
from engine.runtime import messages as m
from engine.runtime.generation import GenerationTask, run_task
from engine.runtime.results import GenerationResult
from engine.runtime.sessions import SessionRegistry, resident_key
from tests import fake_backend as fb

pytestmark = pytest.mark.unit

GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=12)
# Two chat turns, the second starting with the whole first (about 170 tokens: two whole
# chunks of 64 and a part), so the second reuses the first's aligned chunks.
QUESTION = ("Tell me about the sea: the colour of the water in the morning, the sound of "
            "the waves at night, and the boats that go out before the sun is up.")
FIRST = m.Prompt(messages=(m.Message("user", QUESTION),), chat=True)
SECOND = m.Prompt(messages=(
    m.Message("user", QUESTION),
    m.Message("assistant", "The sea is wide and grey and it goes on for ever."),
    m.Message("user", "And the wind?")), chat=True)


def generate(registry: SessionRegistry, spec: SessionSpec, prompt: m.Prompt = FIRST,
             sampling: Sampling = GREEDY) -> GenerationResult:
    result = run_task(GenerationTask(registry, "generate", spec, prompt, sampling,
                                     lambda *a, **k: None, lambda: False))
    assert isinstance(result, GenerationResult)
    return result


def test_a_different_adapter_scale_is_a_different_identity_and_session(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    registry = SessionRegistry(max_sessions=8, n_threads=1)
    full, half = resolve(fake_catalog, "va"), resolve(fake_catalog, "va-half")
    assert full.adapters[0].sha256 == half.adapters[0].sha256  # the same file...
    assert full.identity.key != half.identity.key  # ...at another scale
    one = registry.acquire(full)
    two = registry.acquire(half)
    assert one is not None and two is not None and one is not two
    assert one.context is not two.context
    registry.release(one)
    registry.release(two)
    assert registry.acquire(half) is two  # looked up by its identity, not by the file
    registry.release(two)
    a, b = generate(registry, full), generate(registry, half)
    assert a.identity == full.identity.key and b.identity == half.identity.key
    assert a.logprobs != b.logprobs


def test_scale_zero_computes_the_base_but_never_shares_its_session(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    registry = SessionRegistry(max_sessions=8, n_threads=1)
    base, zero = resolve(fake_catalog, fb.BASE), resolve(fake_catalog, "va0")
    first, second = generate(registry, base), generate(registry, zero)
    assert (first.token_ids, first.logprobs) == (second.token_ids, second.logprobs)
    assert first.text == fb.GREEDY_ANSWER[:GREEDY.max_tokens]
    assert first.identity != second.identity
    assert {s.spec.identity.key for s in registry.sessions} == {first.identity,
                                                                second.identity}
    assert second.reused_tokens == 0  # the base's cache was not lent to the variant


def test_warm_equals_cold_through_the_prefix_cache(fake: fb.FakeBackend,
                                                   fake_catalog: Catalog) -> None:
    spec = resolve(fake_catalog, "va")
    warm_registry = SessionRegistry(n_threads=1)
    generate(warm_registry, spec, FIRST)
    warm = generate(warm_registry, spec, SECOND)
    cold = generate(SessionRegistry(n_threads=1), spec, SECOND)
    assert len(warm_registry.sessions) == 1  # the second turn ran on the first's session
    assert warm.reused_tokens == 128  # two whole chunks; the third was partial
    assert cold.reused_tokens == 0
    assert warm.token_ids == cold.token_ids
    assert warm.logprobs == cold.logprobs  # bit for bit, not approximately


def test_a_busy_session_is_never_shared_and_the_bound_closes_the_oldest_idle(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    registry = SessionRegistry(max_sessions=2, n_threads=1)
    va, vb = resolve(fake_catalog, "va"), resolve(fake_catalog, "vb")
    first = registry.acquire(va)
    second = registry.acquire(va)  # the first is busy: a second session of the identity
    assert first is not None and second is not None and first is not second
    assert first.number != second.number
    assert registry.acquire(vb) is None  # both live sessions busy: the caller waits
    registry.release(first)
    third = registry.acquire(vb)  # the idle one closes to make room
    assert third is not None and third.spec.identity.key == vb.identity.key
    assert first not in registry.sessions and first.context.closed  # type: ignore[attr-defined]
    assert len(registry.sessions) == 2


def test_an_adapter_is_freed_when_the_last_session_using_it_closes(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    registry = SessionRegistry(max_sessions=2, n_threads=1)
    va, vab, vb = (resolve(fake_catalog, n) for n in ("va", "vab", "vb"))
    sha_a, sha_b = va.adapters[0].sha256, vb.adapters[0].sha256
    key = resident_key(va)
    generate(registry, va)
    generate(registry, vab)
    model = fake.models[0]
    assert (registry.adapters.users(key, sha_a), registry.adapters.users(key, sha_b)) == (2, 1)
    generate(registry, vb)  # the bound closes va's session: vab still uses a
    assert model.unloaded == [] and set(model.adapters) == {sha_a, sha_b}
    assert registry.adapters.users(key, sha_a) == 1
    generate(registry, va)  # vab's session closes: a has no user left, b still has one
    assert model.unloaded == [sha_a]
    assert registry.adapters.users(key, sha_b) == 1
    assert sha_a in model.adapters  # loaded again for the new va session
    registry.close_all()
    assert model.closed and model.contexts_closed == model.contexts_opened == 4


def test_a_base_changed_on_disk_is_refused_before_it_loads(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    spec = resolve(fake_catalog, fb.BASE)
    path = Path(spec.base_path)
    path.write_bytes(path.read_bytes() + b"\0" * 32)
    with pytest.raises(RefusedError, match="changed on disk"):
        SessionRegistry(n_threads=1).acquire(spec)
    assert fake.models == []


def test_an_adapter_changed_on_disk_is_refused_and_holds_nothing(
        fake: fb.FakeBackend, fake_catalog: Catalog) -> None:
    registry = SessionRegistry(n_threads=1)
    spec = resolve(fake_catalog, "va")
    Path(spec.adapters[0].path).write_bytes(b"GGUF tampered")
    with pytest.raises(RefusedError, match="changed on disk after import"):
        registry.acquire(spec)
    assert registry.sessions == [] and fake.models[0].contexts_opened == 0
    # The base alone still serves.
    assert generate(registry, resolve(fake_catalog, fb.BASE)).finish_reason == "length"
