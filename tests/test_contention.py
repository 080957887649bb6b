"""The engine's threads on a busy machine (engine.runtime.contention; issue 28, item 12).

The governor's choice is tested with a fake clock and fake CPU figures; one test on the
embedded model holds that changing the thread count between decodes changes no logit,
which is what lets the engine change it while an answer is being decoded.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.runtime import contention
from engine.runtime.contention import DOWN, INTERVAL, CpuTimes, Governor
from engine.runtime.results import GenerationResult, MachineLoad


class FakeMachine:
    """A clock and the CPU seconds it has used: ours and other programs'."""

    def __init__(self) -> None:
        self.now = 100.0
        self.machine = 0.0
        self.ours = 0.0

    def run(self, seconds: float, others: float, ours: float) -> None:
        """`seconds` pass with others using `others` cores and us `ours` cores."""
        self.now += seconds
        self.machine += (others + ours) * seconds
        self.ours += ours * seconds

    def sample(self) -> CpuTimes:
        return CpuTimes(self.machine, self.ours)

    def governor(self, max_threads: int = 2, adaptive: bool = True,
                 cpus: int = 2) -> Governor:
        return Governor(max_threads, adaptive, cpus, self.sample, lambda: self.now)


def decode(governor: Governor, machine: FakeMachine, seconds: float, others: float
           ) -> list[int]:
    """Decode for `seconds` in steps of a fifth of INTERVAL; the threads each step got."""
    used = []
    for _ in range(round(seconds / (INTERVAL / 5))):
        threads = governor.threads()
        used.append(threads)
        machine.run(INTERVAL / 5, others, float(threads))
    return used


@pytest.mark.unit
def test_a_quiet_machine_keeps_one_thread_per_core() -> None:
    machine = FakeMachine()
    governor = machine.governor()
    assert set(decode(governor, machine, 3.0, others=0.1)) == {2}
    assert governor.load() is None


@pytest.mark.unit
def test_a_busy_core_drops_a_thread_within_a_window_and_a_quiet_one_restores_it() -> None:
    machine = FakeMachine()
    governor = machine.governor()
    decode(governor, machine, 1.0, others=0.0)
    busy = decode(governor, machine, 2.0, others=1.0)
    # The change is seen at the first measurement after the hog started: within two
    # windows, and every decode after it runs on one thread.
    first_one = busy.index(1)
    assert first_one <= 10 and set(busy[first_one:]) == {1}
    load = governor.load()
    assert load == MachineLoad(1.0, 1, 2, 2)
    quiet = decode(governor, machine, 2.0, others=0.0)
    assert quiet[-1] == 2 and governor.load() is None


@pytest.mark.unit
def test_hysteresis_keeps_the_count_between_the_two_thresholds() -> None:
    machine = FakeMachine()
    governor = machine.governor()
    assert governor.choose(DOWN + 0.05) == 1
    governor.current = 1
    assert governor.choose(0.4) == 1  # under DOWN but not under UP: stays at one
    assert governor.choose(0.1) == 2
    governor.current = 2
    assert governor.choose(0.4) == 2  # under DOWN: keeps two
    # More cores: as many threads as others leave free, at least one.
    wide = machine.governor(max_threads=8, cpus=8)
    assert wide.choose(2.0) == 6
    assert wide.choose(20.0) == 1


@pytest.mark.unit
def test_an_idle_spell_counts_as_a_window_for_the_first_decode() -> None:
    """A program that started while the engine waited is seen at the request's first
    decode, not after a collapsed first window."""
    machine = FakeMachine()
    governor = machine.governor()
    decode(governor, machine, 1.0, others=0.0)
    machine.run(30.0, others=1.0, ours=0.0)
    assert governor.threads() == 1


@pytest.mark.unit
def test_a_thread_count_the_user_set_is_kept_and_the_slowdown_still_reported() -> None:
    machine = FakeMachine()
    governor = machine.governor(adaptive=False)
    assert set(decode(governor, machine, 2.0, others=1.0)) == {2}
    assert governor.load() == MachineLoad(1.0, 2, 2, 2)
    # Others that leave our cores free do not slow us: 2 threads on 8 cores.
    roomy = machine.governor(adaptive=False, cpus=8)
    decode(roomy, machine, 1.0, others=1.0)
    assert roomy.load() is None


@pytest.mark.unit
def test_an_old_figure_is_not_reported() -> None:
    machine = FakeMachine()
    governor = machine.governor()
    decode(governor, machine, 1.0, others=1.0)
    assert governor.load() is not None
    machine.run(contention.STALE + 1, others=1.0, ours=0.0)
    assert governor.load() is None


@pytest.mark.unit
def test_an_unreadable_machine_is_tried_once_a_window_not_every_decode() -> None:
    """Where /proc/stat cannot be read (not Linux) the governor keeps its threads and
    does not try to read it again before the next window: `threads` runs per token."""
    machine = FakeMachine()
    tries = []

    def unreadable() -> None:
        tries.append(machine.now)

    governor = Governor(2, True, 2, unreadable, lambda: machine.now)
    used = decode(governor, machine, 1.0, others=1.0)
    assert set(used) == {2} and governor.load() is None
    assert len(tries) == round(1.0 / INTERVAL)


@pytest.mark.unit
def test_configured_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VARIANT_STUDIO_THREADS", "3")
    assert contention.configured() == (3, False)
    for automatic in ("0", "", "x"):
        monkeypatch.setenv("VARIANT_STUDIO_THREADS", automatic)
        assert contention.configured() == (contention.cpu_count(), True)
    monkeypatch.delenv("VARIANT_STUDIO_THREADS")
    assert contention.configured()[1] is True


@pytest.mark.unit
def test_without_the_governor_a_decode_gets_what_it_asked(monkeypatch) -> None:
    monkeypatch.setattr(contention, "_governor", None)
    assert contention.threads_for(2) == 2
    assert contention.machine_load() is None
    machine = FakeMachine()
    monkeypatch.setattr(contention, "_governor", machine.governor(max_threads=4))
    machine.run(1.0, others=0.0, ours=0.0)
    assert contention.threads_for(1) == 1  # never more than the decode asked for


@pytest.mark.unit
def test_the_proc_reader_gives_growing_figures() -> None:
    first = contention.read_cpu_times()
    if first is None:  # not Linux: the governor then keeps the threads it was given
        return
    sum(range(200_000))
    second = contention.read_cpu_times()
    assert second is not None and second.machine >= first.machine
    assert second.ours >= first.ours


@pytest.mark.unit
def test_a_result_carries_the_load_over_the_wire() -> None:
    fields = dict(name="m", kind="model", backend="llama", text="", token_ids=(),
                  logprobs=(), identity="i", identity_short="i", adapters=(),
                  prompt_tokens=1, reused_tokens=0, prompt_seconds=0.0,
                  finish_reason=None, tokens_per_second=1.0)
    plain = GenerationResult(**fields)
    assert "machine_load" not in plain.to_dict()
    busy = GenerationResult(**fields, machine_load=MachineLoad(1.0, 1, 2, 2))
    assert GenerationResult.from_dict(busy.to_dict()) == busy


def test_changing_threads_between_decodes_changes_no_logit() -> None:
    import llama_cpp

    from engine.curated.embedded import embedded_model_path
    from engine.runtime.llama.backend import LlamaContext, LlamaModel

    model = LlamaModel(str(embedded_model_path()), "test")
    prompt = model.tokenize("Write a story about a lighthouse keeper.", False)

    def run(switch_at: int | None) -> np.ndarray:
        context = LlamaContext(model, (), 512, 512, 2)
        try:
            logits = [context.prefill(prompt)]
            for i in range(16):
                if i == switch_at:
                    llama_cpp.llama_set_n_threads(context.ptr, 1, 1)
                logits.append(context.step(int(np.argmax(logits[-1]))))
            return np.stack(logits)
        finally:
            context.close()

    assert np.array_equal(run(None), run(5))
