"""Bounded work: inspecting any file takes bounded time and memory whatever its header
claims; devices, FIFOs and pseudo-files are refused before a single byte is read;
template rendering stays within its limits.

Memory is measured with tracemalloc (every Python and numpy allocation): a header that
claims 2^64 items must not make us allocate for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.catalog import digest
from engine.errors import InspectionError, StudioError
from engine.formats import artifacts, safeio
from engine.formats.artifacts import BaseModelInfo
from tests import factories as f
from tests.hostile_cases import (
    CASES,
    MAX64,
    T,
    Unavailable,
    Workshop,
    array_kv,
    assemble,
    deadline,
    gguf_one_kv,
    kv,
    lora_kvs,
    mini_lora,
    peft_tensors,
    st_entries,
)

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
FILE_SURFACES = ("adapter", "peft", "model")


def measure(action: Callable[[], Any]) -> tuple[float, int, BaseException | None]:
    """(seconds, peak traced bytes, the error raised or None)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = time.perf_counter()
    error: BaseException | None = None
    try:
        with deadline(30, "inspection"):
            action()
    except StudioError as exc:
        error = exc
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return elapsed, peak, error


def timed(action: Callable[[], Any]) -> float:
    """Seconds taken, without tracemalloc's overhead (refusals are expected)."""
    start = time.perf_counter()
    with contextlib.suppress(StudioError), deadline(30, "inspection"):
        action()
    return time.perf_counter() - start


def size_of(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


@pytest.mark.slow
def test_every_hostile_file_is_inspected_within_time_and_memory_bounds(
        tmp_path: Path, base_info: BaseModelInfo, embedded_path: Path) -> None:
    """The bound: 3 s and 16 MiB plus twice the file's real size, whatever it claims
    (the time bound is loose for busy CI machines; unbounded work would take hours)."""
    w = Workshop(tmp_path, base_info, embedded_path)
    measured = 0
    for case in CASES:
        if case.surface not in FILE_SURFACES:
            continue
        try:
            target = Path(case.build(w))
        except Unavailable:
            continue
        real = size_of(target)
        if real > 64 * MiB:
            continue  # the real-model copies are measured below
        elapsed = timed(lambda t=target: artifacts.inspect_path(t))
        _, peak, _ = measure(lambda t=target: artifacts.inspect_path(t))
        measured += 1
        assert elapsed < 3.0, f"{case.id}: inspection took {elapsed:.2f} s"
        assert peak < 16 * MiB + 2 * real, f"{case.id}: {peak / MiB:.1f} MiB for {real} bytes"
    assert measured >= 100, measured


def test_a_real_model_header_is_read_without_touching_the_weights(
        embedded_path: Path) -> None:
    """98 MB model, ~3 MB of metadata (a 49 152-token vocabulary): bounded by the header."""
    assert timed(lambda: artifacts.inspect_path(embedded_path)) < 15.0
    _, peak, error = measure(lambda: artifacts.inspect_path(embedded_path))
    assert error is None
    assert peak < 48 * MiB, f"{peak / MiB:.1f} MiB"


@pytest.mark.parametrize("claim", ["tensors", "kvs", "string", "array", "dims", "safetensors"])
def test_absurd_claims_fail_at_once(tmp_path: Path, claim: str) -> None:
    """Each header claims about 2^64 of something in a file of under 200 bytes."""
    data = {
        "tensors": lambda: assemble(lora_kvs(), [], n_tensors=MAX64),
        "kvs": lambda: assemble([], [], n_kv=MAX64),
        "string": lambda: gguf_one_kv(kv("x.s", 8, MAX64.to_bytes(8, "little")), []),
        "array": lambda: gguf_one_kv(array_kv("x.a", 12, MAX64), []),
        "dims": lambda: assemble(lora_kvs(), [T("x", (2**39, 2**39, 2**39, 2**39), data=b"")]),
        "safetensors": lambda: f.raw_safetensors("{}", length=MAX64),
    }[claim]()
    path = tmp_path / ("x.safetensors" if claim == "safetensors" else "x.gguf")
    path.write_bytes(data)
    assert len(data) < 1024
    elapsed, peak, error = measure(lambda: artifacts.inspect_path(path))
    assert isinstance(error, InspectionError)
    assert elapsed < 1.0 and peak < 2 * MiB, (elapsed, peak)


def special_files(tmp_path: Path) -> dict[str, Path]:
    found = {}
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        found["fifo"] = tmp_path / "fifo"
    for name, target in (("zero", "/dev/zero"), ("urandom", "/dev/urandom"),
                         ("tty", "/dev/tty"), ("proc", "/proc/self/status"),
                         ("sys", "/sys/kernel/mm/transparent_hugepage/enabled")):
        if os.path.exists(target):
            os.symlink(target, tmp_path / name)
            found[name] = tmp_path / name
    return found


def test_devices_fifos_and_pseudo_files_are_refused_before_any_read(tmp_path: Path) -> None:
    """Every reader of untrusted paths goes through safeio; none of them blocks or reads
    forever: each refusal is instant."""
    specials = special_files(tmp_path)
    if "fifo" not in specials or "zero" not in specials:
        pytest.skip("this OS has no FIFOs or no /dev/zero")
    readers: dict[str, Callable[[Path], Any]] = {
        "inspect_path": artifacts.inspect_path,
        "open_regular": safeio.open_regular,
        "sha256": digest.hash_uncached,
        "content_digest": digest.content_digest,
        "json": lambda p: artifacts.read_json_file(p, "config"),
    }
    for name, path in specials.items():
        for reader_name, reader in readers.items():
            start = time.perf_counter()
            with deadline(5, f"{reader_name}({name})"), pytest.raises(InspectionError) as info:
                reader(path)
            assert time.perf_counter() - start < 1.0, (reader_name, name)
            assert "expected a regular file" in info.value.message, info.value.message


def test_a_path_swapped_for_a_fifo_after_the_check_does_not_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: stat says regular file, then the path becomes a FIFO before open.
    open() uses O_NONBLOCK, so it returns at once and the inode check refuses it."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("this OS has no FIFOs")
    regular = tmp_path / "regular"
    regular.write_bytes(b"GGUF")
    fake = safeio.stat_regular(regular)
    path = tmp_path / "swapped"
    os.mkfifo(path)
    monkeypatch.setattr(safeio, "stat_regular", lambda p: fake)
    with deadline(5, "open of a swapped FIFO"), pytest.raises(InspectionError) as info:
        safeio.open_regular(path)
    assert "changed while it was being opened" in info.value.message


def test_a_file_that_grows_while_hashed_is_hashed_to_a_bound(tmp_path: Path) -> None:
    """Inspection reads only what the header and the size at open allow: appending to
    the file during inspection changes nothing we read."""
    path = tmp_path / "growing.gguf"
    path.write_bytes(mini_lora())
    header = artifacts.gguf_file.read_header(path)
    with path.open("ab") as handle:
        handle.write(b"\0" * (4 * MiB))
    # The header parsed before the growth still describes exactly the same tensors.
    assert artifacts.gguf_file.read_header(path).tensors == header.tensors
    # Reading a tensor through a stale header is refused: the file changed since.
    with pytest.raises(InspectionError, match="changed since it was inspected"):
        artifacts.gguf_file.read_tensor(header, "blk.0.attn_q.weight.lora_a")


@pytest.mark.parametrize(("template", "reason"), [
    ("{{ 'x' * 100000000 }}", "exceeds"),
    # Each step adds 10 000 characters: the output cap, not the time limit, stops it
    # even on a loaded machine.
    ("{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}", "exceeds"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s }}", "too much memory"),
    # One C call, where no trace hook runs: sized before it runs.
    ("{{ 'x'.ljust(10 ** 10) }}", "exceeds"),
    ("{{ 'x' | center(10 ** 10) }}", "exceeds"),
    ("{% set s = 'x' * 4000000 %}{{ ([s] * 1000) | join }}", "exceeds"),
    ("{% set s = 'x' * 4000000 %}{{ ''.join([s] * 1000) }}", "exceeds"),
    ("{{ 10 ** 100000000 }}", "absurd power"),
    ("{{ " + "(" * 300 + "1" + ")" * 300 + " }}", "nested too deeply to compile"),
    ("{% if 1 %}" * 500 + "{% endif %}" * 500, "nested too deeply to compile"),
    ("{{ " + "not " * 2000 + "1 }}", "nested too deeply to compile"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "did not finish"),
])
def test_template_rendering_is_bounded_in_time_and_memory(template: str, reason: str) -> None:
    """Output is capped at 4 Mi chars, rendering at 2 s and its growth of resident
    memory at 64 MiB: doubling a string 40 times (a terabyte) is stopped by the memory
    watch, padding one to 10^10 chars or joining 4 billion in a single C call is refused
    before it runs; each is reported as a TemplateError.

    Each case renders in a process of its own: the cap counts new address space, and
    memory that earlier tests freed but the allocator kept mapped (glibc keeps freed
    blocks of up to 32 MiB in its heap) would be reused without counting."""
    elapsed, peak, error_type, message = render_in_fresh_process(template)
    assert error_type == "TemplateError", (error_type, message)
    assert reason in message
    assert elapsed < 5.0
    assert peak < 256 * MiB, f"{peak / MiB:.0f} MiB"


RENDER = """
import json, sys
from engine.formats.templates import Message, TemplateError, render
from tests.test_hostile_bounds import measure
elapsed, peak, error = measure(lambda: render(sys.argv[1], [Message("user", "Hello")]))
print(json.dumps([elapsed, peak, type(error).__name__ if isinstance(error, TemplateError)
                  else repr(error), getattr(error, "message", "")]))
"""


def render_in_fresh_process(template: str) -> tuple[float, int, str, str]:
    """`measure` of rendering `template`, in a new Python process."""
    done = subprocess.run([sys.executable, "-c", RENDER, template], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    elapsed, peak, error_type, message = json.loads(done.stdout.strip().splitlines()[-1])
    return elapsed, peak, error_type, message


def test_a_panic_in_the_safetensors_library_is_a_refusal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyo3 turns a Rust panic into PanicException, a BaseException: still a refusal."""
    import safetensors

    class PanicException(BaseException):
        pass

    def panic(*args: Any, **kwargs: Any) -> Any:
        raise PanicException("index out of bounds\x1b[2J")

    path = tmp_path / "adapter_model.safetensors"
    path.write_bytes(f.raw_safetensors(*st_entries(peft_tensors())))
    monkeypatch.setattr(safetensors, "safe_open", panic)
    with pytest.raises(InspectionError) as info:
        artifacts.safetensors_file.read_header(path)
    assert "rejected by the safetensors library: index out of bounds\\x1b[2J" in (
        info.value.message)
