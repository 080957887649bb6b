"""Property-based fuzzing of the inspectors and of template rendering (hypothesis).

The invariant, for every generated input: it ends in a result or a typed error
(InspectionError / RefusedError / TemplateError), within a time bound, and what it
yields is sound (accepted tensors lie inside the file and do not overlap; validation
of an accepted adapter gives a report rather than an exception; rendered text is
within the output cap). Each generator's own test also checks that it is not
degenerate: refusals, accepted headers, accepted adapters and rendered templates all
occur among its executions.

CI runs a short, derandomized pass (fixed examples, so a run of someone else's
change cannot fail by luck). `scripts/fuzz.py` runs the same properties for longer
with fresh randomness (and atheris, coverage-guided, when installed):
`VARIANT_STUDIO_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/test_fuzz.py`.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import struct
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from engine.catalog import validation
from engine.errors import RefusedError
from engine.formats import artifacts, gguf_file, safetensors_file
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.formats.safeio import printable
from engine.formats.templates import MAX_OUTPUT_CHARS, Message, render
from tests.hostile_cases import (
    PEFT_Q,
    T,
    Workshop,
    assemble,
    deadline,
    f32,
    kv,
    lora_kvs,
    ov_folder,
)

EXAMPLES = int(os.environ.get("VARIANT_STUDIO_FUZZ_EXAMPLES", "0"))
LONG = EXAMPLES > 0
BOUND_SECONDS = 10  # per input; the properties fail (not hang) past it
EXECUTIONS: Counter[str] = Counter()


def fuzz_settings(ci_examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or ci_examples,
        derandomize=not LONG,
        deadline=None,  # our own bound below (SIGALRM) is the hang detector
        database=None if not LONG else DirectoryBasedExampleDatabase(
            Path(platformdirs.user_cache_dir("variant-studio")) / "hypothesis"),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
        print_blob=True,
    )


# --------------------------------------------------------------------------- harness


_scratch = Path(tempfile.mkdtemp(prefix="vs-fuzz-"))
atexit.register(shutil.rmtree, _scratch, ignore_errors=True)
_ov_base: list[BaseModelInfo] = []


def ov_base() -> BaseModelInfo:
    """The OpenVINO folder of the hostile suite, inspected once."""
    if not _ov_base:
        w = Workshop(Path(tempfile.mkdtemp(dir=_scratch)), None, Path())  # type: ignore[arg-type]
        info = artifacts.inspect_path(ov_folder(w, "ov"))
        assert isinstance(info, BaseModelInfo)
        _ov_base.append(info)
    return _ov_base[0]


def _sound_gguf(header: gguf_file.GgufHeader) -> None:
    spans = sorted((t.offset, t.offset + t.nbytes) for t in header.tensors.values())
    for begin, end in spans:
        assert header.data_offset <= begin <= end <= header.stat.size
    for (_, end_a), (begin_b, _) in zip(spans, spans[1:], strict=False):
        assert begin_b >= end_a


def _sound_adapter(info: AdapterInfo, base: BaseModelInfo, backend: str) -> None:
    report = validation.check_adapter(info, base, backend, "0" * 64)
    assert report.status in ("pass", "warn", "fail")
    json.dumps(info.summary())
    assert printable(report.reason()).isprintable()


def check_gguf_bytes(data: bytes, base: BaseModelInfo) -> str:
    """One execution: parse, inspect and validate `data` as a .gguf file."""
    path = _scratch / "input.gguf"
    path.write_bytes(data)
    with deadline(BOUND_SECONDS, "GGUF inspection"):
        try:
            header = gguf_file.read_header(path)
        except RefusedError:
            outcome = "refused"
        else:
            _sound_gguf(header)
            outcome = "parsed"
        try:
            info = artifacts.inspect_path(path)
        except RefusedError:
            return outcome
        if isinstance(info, AdapterInfo):
            _sound_adapter(info, base, "llama")
            return "adapter"
        json.dumps(info.summary())
        return "base"


def check_safetensors_bytes(data: bytes, config: bytes | None = None) -> str:
    """One execution: a PEFT adapter from `data` (and an optional adapter_config.json)."""
    folder = _scratch / "peft"
    folder.mkdir(exist_ok=True)
    path = folder / "adapter_model.safetensors"
    path.write_bytes(data)
    config_path = folder / "adapter_config.json"
    if config is None:
        config_path.unlink(missing_ok=True)
    else:
        config_path.write_bytes(config)
    with deadline(BOUND_SECONDS, "safetensors inspection"):
        try:
            header = safetensors_file.read_header(path)
        except RefusedError:
            outcome = "refused"
        else:
            for t in header.tensors.values():
                assert 8 <= t.begin <= t.end <= header.stat.size
            outcome = "parsed"
        try:
            info = artifacts.inspect_path(folder)
        except RefusedError:
            return outcome
        assert isinstance(info, AdapterInfo)
        _sound_adapter(info, ov_base(), "openvino")
        return "adapter"


def check_template(template: str, messages: list[Message]) -> str:
    with deadline(BOUND_SECONDS, "template rendering"):
        try:
            text = render(template, messages, bos_token="<s>", eos_token="</s>",
                          deadline=0.5)
        except RefusedError:
            return "refused"
    assert isinstance(text, str) and len(text) <= MAX_OUTPUT_CHARS
    return "rendered"


@pytest.fixture(scope="module", autouse=True)
def report_executions() -> Iterator[None]:
    yield
    total = sum(EXECUTIONS.values())
    lines = [f"fuzz executions: {total}"] + [f"  {k}: {v}" for k, v in sorted(EXECUTIONS.items())]
    print("\n" + "\n".join(lines))
    target = os.environ.get("VARIANT_STUDIO_FUZZ_REPORT")
    if target:
        Path(target).write_text(json.dumps(dict(EXECUTIONS), indent=2, sort_keys=True))


# --------------------------------------------------------------------------- strategies

INTERESTING_U64 = [0, 1, 2, 7, 8, 31, 32, 33, 63, 64, 576, 4096, 2**31 - 1, 2**31, 2**32 - 1,
                   2**32, 2**40, 2**50, 2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
u64 = st.one_of(st.sampled_from(INTERESTING_U64), st.integers(0, 2**64 - 1))
u32 = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 8, 9, 12, 13, 30, 31, 39, 200, 2**31,
                                 2**32 - 1]), st.integers(0, 2**32 - 1))
KEYS = ["general.architecture", "general.type", "general.name", "general.alignment",
        "adapter.type", "adapter.lora.alpha", "adapter.base.sha256",
        "general.base_model.0.name", "llama.block_count", "llama.embedding_length",
        "llama.attention.head_count", "llama.attention.head_count_kv",
        "llama.context_length", "tokenizer.chat_template", "tokenizer.ggml.tokens",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", ""]
STRINGS = ["llama", "adapter", "lora", "model", "qwen2", "", "../../x", "\x1b[2J", "x" * 300]
TENSOR_NAMES = ["blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b",
                "blk.0.attn_v.weight.lora_a", "blk.0.attn_v.weight.lora_b",
                "blk.99.attn_q.weight.lora_a", "blk.0.attn_q.weight", "token_embd.weight",
                "output.weight", "", "x" * 300, "blk.0.attn_q.weight.lora_c"]


def rarely(draw: st.DrawFn, strategy: st.SearchStrategy, usual: Any, odds: int = 6) -> Any:
    """`usual` most of the time, a draw from `strategy` one time in `odds`."""
    # (hypothesis favours the ends of a range, so the rare branch sits in the middle)
    return draw(strategy) if draw(st.integers(0, odds - 1)) == 1 else usual


@st.composite
def gguf_values(draw: st.DrawFn) -> tuple[int, bytes]:
    """(type id, encoded value) — well formed most of the time, hostile sometimes."""
    kind = rarely(draw, st.integers(13, 2**32 - 1), draw(st.integers(0, 12)), 10)
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
    if kind in fmt:
        if kind in (6, 12):
            value: Any = draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
        elif kind == 7:
            value = draw(st.booleans())
        else:
            size = struct.calcsize(fmt[kind]) * 8
            signed = fmt[kind][1].islower()
            value = draw(st.integers(-(2 ** (size - 1)) if signed else 0,
                                     2 ** (size - 1) - 1 if signed else 2**size - 1))
        return kind, struct.pack(fmt[kind], value)
    if kind == 8:
        text = draw(st.one_of(st.sampled_from(STRINGS), st.text(max_size=40)))
        raw = text.encode("utf-8", "surrogatepass")
        length = rarely(draw, u64, len(raw))
        return 8, struct.pack("<Q", length) + raw
    if kind == 9:
        item = rarely(draw, u32, draw(st.sampled_from([0, 4, 6, 8, 9, 10])))
        count = rarely(draw, u64, draw(st.integers(0, 70)))
        if item == 8:
            body = b"".join(struct.pack("<Q", 1) + b"t" for _ in range(min(count, 70)))
        else:
            body = b"\x01" * (min(count, 70) * 4)
        return 9, struct.pack("<IQ", item, count) + body
    return draw(u32), draw(st.binary(max_size=16))


@st.composite
def gguf_files(draw: st.DrawFn) -> bytes:
    kvs = []
    if draw(st.integers(0, 3)):
        kvs = lora_kvs(arch=rarely(draw, st.sampled_from(["qwen2", None]), "llama"),
                       alpha=rarely(draw, st.one_of(st.none(), st.floats(width=32)), 16.0))
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.one_of(st.sampled_from(KEYS), st.text(max_size=20)))
        type_id, payload = draw(gguf_values())
        kvs.append(kv(key.encode("utf-8", "surrogatepass"), type_id, payload))
    tensors = []
    if draw(st.integers(0, 2)):  # valid adapter pairs, for validation to chew on
        rank = rarely(draw, st.sampled_from([0, 2**40]), draw(st.sampled_from([1, 4, 8])))
        for target in draw(st.lists(st.sampled_from(
                ["blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.99.attn_q.weight",
                 "blk.0.attn_k.weight"]), min_size=1, max_size=2, unique=True)):
            n_out = 192 if "attn_v" in target or "attn_k" in target else 576
            value = rarely(draw, st.sampled_from([math.nan, math.inf, 1e38]), 0.01)
            tensors += [T(f"{target}.lora_a", (576, rank), data=f32(576 * rank, value)
                          if rank < 64 else b""),
                        T(f"{target}.lora_b", (rank, n_out), data=f32(rank * n_out)
                          if rank < 64 else b"")]
    for _ in range(draw(st.integers(0, 2))):
        n_dims = rarely(draw, st.integers(0, 6), draw(st.integers(1, 2)))
        dims = tuple(rarely(draw, u64, draw(st.sampled_from([1, 8, 32, 576])))
                     for _ in range(n_dims))
        type_id = rarely(draw, u32, draw(st.sampled_from([0, 1, 2, 8, 26, 30])))
        offset = rarely(draw, st.one_of(st.sampled_from([0, 4, 32, 2**63]), u64), None)
        count = math.prod(dims) if dims and all(d < 2**12 for d in dims) else 1
        data = f32(min(count, 4096)) if draw(st.integers(0, 3)) else b""
        tensors.append(T(draw(st.sampled_from(TENSOR_NAMES)), dims, type_id, data, offset))
    data = assemble(kvs, draw(st.permutations(tensors)),
                    version=rarely(draw, u32, draw(st.sampled_from([3, 2]))),
                    magic=rarely(draw, st.binary(min_size=4, max_size=4), b"GGUF", 12),
                    n_tensors=rarely(draw, u64, None, 10),
                    n_kv=rarely(draw, u64, None, 10))
    return mutate(draw, data)


def mutate(draw: st.DrawFn, data: bytes) -> bytes:
    """Optional truncation and byte flips, as a fuzzer would."""
    if data and draw(st.integers(0, 7)) == 0:
        data = data[:draw(st.integers(0, len(data)))]
    if data and draw(st.integers(0, 7)) == 0:
        buf = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
        data = bytes(buf)
    return data


SHAPE = st.lists(st.one_of(st.sampled_from([0, 1, 8, 576]), st.integers(-(2**64), 2**64)),
                 max_size=4)
DTYPES = ["F32", "F16", "BF16", "I32", "U8", "BOOL", "F8_E4M3", "F128", "", "f32"]


@st.composite
def safetensors_files(draw: st.DrawFn) -> bytes:
    header: dict[str, Any] = {}
    blob = b""
    if draw(st.integers(0, 3)):  # start from a valid rank-r pair
        rank = rarely(draw, st.just(0), draw(st.sampled_from([1, 8])))
        for half, shape in (("lora_A", [rank, 576]), ("lora_B", [576, rank])):
            data = f32(rank * 576, rarely(draw, st.sampled_from([math.nan, math.inf]), 0.01))
            header[f"{PEFT_Q}.{half}.weight"] = {
                "dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
            blob += data
    for _ in range(rarely(draw, st.integers(1, 4), 0, 3)):
        name = draw(st.one_of(st.sampled_from([f"{PEFT_Q}.lora_A.weight",
                                               f"{PEFT_Q}.lora_B.weight", "__metadata__",
                                               "x.lora_A.weight", ""]), st.text(max_size=30)))
        entry: Any = {
            "dtype": draw(st.sampled_from(DTYPES)),
            "shape": draw(SHAPE),
            "data_offsets": draw(st.lists(st.one_of(st.sampled_from([0, 4, 8, len(blob)]),
                                                    st.integers(-(2**64), 2**64)),
                                          max_size=3)),
        }
        if draw(st.integers(0, 6)) == 0:
            entry = draw(st.one_of(st.none(), st.integers(), st.text(max_size=5),
                                   st.dictionaries(st.text(max_size=5), st.integers(),
                                                   max_size=3)))
        header[name] = entry
        if draw(st.booleans()):
            blob += b"\0" * draw(st.sampled_from([4, 8, 16]))
    text = json.dumps(header)
    if draw(st.integers(0, 8)) == 0:
        text = draw(st.sampled_from(["[" * 5000, "{}", "[]", "null", '{"a": 1, "a": 2}',
                                     text[: len(text) // 2]]))
    raw = text.encode()
    length = rarely(draw, st.one_of(st.integers(0, len(raw) + 64), u64), len(raw), 8)
    return mutate(draw, struct.pack("<Q", length) + raw + blob)


CONFIGS = st.one_of(
    st.none(),
    st.just(b'{"r": 8, "lora_alpha": 16}'),
    st.builds(lambda d: json.dumps(d).encode(),
              st.dictionaries(st.sampled_from(["r", "lora_alpha", "target_modules",
                                               "base_model_name_or_path"]),
                              st.one_of(st.integers(-5, 2**40), st.floats(), st.text(max_size=5),
                                        st.lists(st.text(max_size=5), max_size=3)),
                              max_size=4)),
    st.binary(max_size=40),
)

FRAGMENTS = [
    "{{ messages[0].content }}", "{{ message['role'] }}", "{{ bos_token }}", "{{ eos_token }}",
    "{% for message in messages %}", "{% endfor %}", "{% if add_generation_prompt %}",
    "{% endif %}", "{% else %}", "{{ raise_exception('no') }}", "{{ x }}",
    "{% set x = 'ab' * 3 %}", "{{ (messages|length) ** 99 }}", "{{ 'x' * 9999999 }}",
    "{{ ''.__class__ }}", "{{ messages.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}",
    "{{ messages.append(1) }}", "{{ range(10)|list }}", "{% for i in range(99999) %}{{ i }}",
    "{{ 'x'.ljust(10 ** 9) }}", "{{ 'ab'|replace('a', 'aaaa') }}", "{{ messages|tojson }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{{ lipsum(99) }}",
    "{{ self }}", "{{ namespace(a=1).a }}", "{% set ns = namespace(s='x') %}",
    "{% set ns.s = ns.s ~ ns.s %}", "{{ ns.s|length }}", "{{ 1/0 }}", "{{ '%s' % 1 }}",
    "{{ '{0.__class__}'.format(1) }}", "{{ message.content|trim }}", "<|im_start|>", "\n",
    "{%", "}}", "{#", "#}", "{% raw %}", "{% endraw %}",
    "{{ " + "(" * 120, ")" * 120 + " }}", "{% if 1 %}" * 40, "{% endif %}" * 40,
]


@st.composite
def templates(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=10)),
                          max_size=12))
    return "".join(parts)


MESSAGES = st.lists(st.builds(Message, st.sampled_from(["system", "user", "assistant",
                                                          "tool"]),
                              st.text(max_size=30)), min_size=0, max_size=4)


# --------------------------------------------------------------------------- properties


def reached(kind: str, seen: Counter[str], outcomes: tuple[str, ...], ci_examples: int
            ) -> None:
    """The generator is not degenerate: each of `outcomes` occurred in this test's own
    executions (so the check holds whatever else ran before it). Checked on the CI pass
    and on longer runs; a shorter local run (`scripts/fuzz.py --examples 20`) proves
    nothing either way."""
    EXECUTIONS.update({f"{kind} {k}": v for k, v in seen.items()})
    if LONG and ci_examples > EXAMPLES:
        return
    for outcome in outcomes:
        assert seen[outcome] > 0, (kind, outcome, dict(seen))


def test_fuzz_gguf_inspection(base_info: BaseModelInfo) -> None:
    seen: Counter[str] = Counter()

    @fuzz_settings(400)
    @given(data=gguf_files())
    def gguf_inspection(data: bytes) -> None:
        seen[check_gguf_bytes(data, base_info)] += 1

    gguf_inspection()
    reached("gguf", seen, ("refused", "parsed", "adapter"), 400)


@fuzz_settings(150)
@given(data=st.binary(max_size=512))
def test_fuzz_raw_bytes_as_gguf(data: bytes, base_info: BaseModelInfo) -> None:
    EXECUTIONS[f"raw gguf {check_gguf_bytes(b'GGUF' + data, base_info)}"] += 1


def test_fuzz_safetensors_inspection() -> None:
    seen: Counter[str] = Counter()

    @fuzz_settings(300)
    @given(data=safetensors_files(), config=CONFIGS)
    def safetensors_inspection(data: bytes, config: bytes | None) -> None:
        seen[check_safetensors_bytes(data, config)] += 1

    safetensors_inspection()
    reached("safetensors", seen, ("refused", "adapter"), 300)


def test_fuzz_template_rendering() -> None:
    seen: Counter[str] = Counter()

    @fuzz_settings(300)
    @given(template=templates(), messages=MESSAGES)
    def template_rendering(template: str, messages: list[Message]) -> None:
        seen[check_template(template, messages)] += 1

    template_rendering()
    reached("template", seen, ("refused", "rendered"), 300)


@fuzz_settings(200)
@given(text=st.text(), limit=st.integers(0, 300))
@example(text="\ud7fc", limit=1)  # found by the long run: escaped as the ambiguous \xd7fc
def test_fuzz_printable(text: str, limit: int) -> None:
    shown = printable(text, limit)
    assert shown.isprintable() and len(shown) <= 10 * limit + 1
    # Every escape is a well-formed Python escape that decodes back to the original.
    body = shown.removesuffix("…") if len(text) > limit else shown
    if "\\" not in text:
        assert body.encode("latin-1", "backslashreplace").decode("unicode_escape") == (
            text[:limit])
    EXECUTIONS["printable"] += 1

