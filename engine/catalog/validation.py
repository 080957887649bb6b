"""Compatibility validation: named checks, each pass, warn or fail with a reason.

An adapter is checked against one base before it is admitted to the catalog and
again before a session uses it. The rules follow llama.cpp's own loader for GGUF
adapters (which only logs its reason) and OpenVINO's name matching for PEFT adapters
(which silently ignores what matches nothing), so the user sees the reason up front.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.catalog.digest import CancelCheck, Progress
from engine.errors import Cancelled, InspectionError, RefusedError
from engine.formats import gguf_file, lora_io, naming, safetensors_file
from engine.formats.artifacts import AdapterInfo, BaseModelInfo, LoraPair
from engine.formats.safeio import printable

PASS, WARN, FAIL = "pass", "warn", "fail"
MAX_SCALE = 10.0
MAX_ALPHA = 4096.0
ADAPTER_DTYPES = {"F32", "F16", "BF16", "Q8_0"}
MAX_VALUE_SCAN_BYTES = 1 << 30
BACKEND_FORMATS = {"llama": "gguf", "openvino": "peft"}
FORMAT_NAMES = {"gguf": "a GGUF LoRA (llama.cpp)", "peft": "a PEFT safetensors LoRA (OpenVINO)"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.checks}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS

    @property
    def ok(self) -> bool:
        return self.status != FAIL

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARN]

    def reason(self) -> str:
        """One line naming the first failure (or the first warning)."""
        first = (self.failures() or self.warnings() or [None])[0]
        return f"{first.name}: {first.detail}" if first else "all checks passed"

    def to_list(self) -> list[dict[str, str]]:
        return [c.to_dict() for c in self.checks]


def _out_of_bounds(name: str, value: object, high: float, negative: str) -> str | None:
    """Why `value` is no usable scale or alpha (NaN, infinite, negative, over `high`)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} must be a number, got {value!r}"
    if math.isnan(value):
        return f"{name} is NaN"
    if math.isinf(value):
        return f"{name} is infinite"
    if value < 0:
        return f"{name} {value:g} is negative{negative}"
    if value > high:
        return f"{name} {value:g} is absurd (at most {high:g})"
    return None


def check_scale(scale: float) -> Check:
    problem = _out_of_bounds("scale", scale, MAX_SCALE, " (use 0 to turn an adapter off)")
    if problem:
        return Check("scale", FAIL, problem)
    return Check("scale", PASS, f"scale {scale:g} within 0..{MAX_SCALE:g}")


def require_scale(scale: float, what: str) -> None:
    """Refuse an unusable scale, naming `what` it belongs to."""
    check = check_scale(scale)
    if check.status == FAIL:
        raise RefusedError(f"{what}: {check.detail}")


def effective_multiplier(info: AdapterInfo, scale: float) -> float:
    """What B·A is multiplied by: scale x alpha / rank (alpha absent or 0: just scale).

    llama.cpp applies this itself from the GGUF's adapter.lora.alpha; OpenVINO ignores
    adapter_config.json's alpha, so the OpenVINO backend passes this number.
    """
    return lora_io.multiplier(scale, info.alpha, info.rank)


def check_adapter(
    adapter: AdapterInfo,
    base: BaseModelInfo,
    base_backend: str,
    base_sha256: str,
    *,
    strict: bool = False,
    scan_values: bool = True,
    values: Check | None = None,
    progress: Progress | None = None,
    cancelled: CancelCheck | None = None,
) -> Report:
    """Every check for `adapter` on `base` (served by `base_backend`).

    The value scan reads every weight (long for a large adapter: `progress` and
    `cancelled` follow it). `values` is a scan result already known for these exact
    bytes (the one recorded at import for the same sha256), which stands in for it.
    """
    checks = [_format(adapter, base_backend), _structure(adapter)]
    if checks[0].status == FAIL:
        return Report(tuple(checks))
    checks.append(_architecture(adapter, base))
    if adapter.format == "peft" and base_backend == "openvino":
        checks.extend(_openvino_coverage(adapter, base))
    else:
        checks.extend(_coverage_and_shapes(adapter, base))
    checks.append(_rank(adapter))
    checks.append(_alpha(adapter))
    checks.append(_dtypes(adapter))
    if scan_values and all(c.status != FAIL for c in checks):
        checks.append(values if values is not None else _values(adapter, progress, cancelled))
    checks.append(_expected_base(adapter, base, base_sha256, strict))
    return Report(tuple(checks))


def _format(adapter: AdapterInfo, base_backend: str) -> Check:
    wanted = BACKEND_FORMATS[base_backend]
    if adapter.format != wanted:
        engine = "llama.cpp" if base_backend == "llama" else "OpenVINO"
        return Check("format", FAIL, f"this is {FORMAT_NAMES[adapter.format]}, but the base "
                     f"runs on {engine}, which needs {FORMAT_NAMES[wanted]}")
    return Check("format", PASS, f"{FORMAT_NAMES[adapter.format]} for a {base_backend} base")


def _structure(adapter: AdapterInfo) -> Check:
    if adapter.problems:
        more = f" (and {len(adapter.problems) - 1} more)" if len(adapter.problems) > 1 else ""
        return Check("structure", FAIL, adapter.problems[0] + more)
    return Check("structure", PASS, f"{len(adapter.pairs)} complete A/B pairs")


def _architecture(adapter: AdapterInfo, base: BaseModelInfo) -> Check:
    arch = adapter.architecture
    if arch is None:
        if adapter.format == "gguf":
            return Check("architecture", FAIL, "adapter declares no general.architecture "
                         "(llama.cpp refuses it)")
        return Check("architecture", WARN, "adapter declares no architecture; "
                     "judged by its layer names and shapes")
    if arch != base.architecture:
        return Check("architecture", FAIL, f"adapter is for '{printable(arch)}', "
                     f"the base is {base.architecture!r}")
    return Check("architecture", PASS, f"{arch} on both sides")


def _coverage_and_shapes(adapter: AdapterInfo, base: BaseModelInfo) -> list[Check]:
    total = len(adapter.pairs)
    tensors_total = total * 2
    if adapter.format == "gguf":
        # ggml order: base (in, out), lora_a (in, rank), lora_b (rank, out).
        targets: dict[str, tuple[int, ...]] = base.tensor_shapes()

        def mismatch(p: LoraPair, ne: tuple[int, ...]) -> str | None:
            if len(ne) == 2 and ne[0] == p.a_shape[0] and ne[1] == p.b_shape[1]:
                return None
            return f"base {list(ne)}, lora_a {list(p.a_shape)}, lora_b {list(p.b_shape)}"
    else:
        targets = dict(base.module_shapes())

        def mismatch(p: LoraPair, shape: tuple[int, ...]) -> str | None:
            out_f, in_f = shape
            if p.a_shape[1] == in_f and p.b_shape[0] == out_f:
                return None
            return f"layer is {out_f}x{in_f}, A {list(p.a_shape)}, B {list(p.b_shape)}"

    unmatched = [p.target for p in adapter.pairs if p.target not in targets]
    bad = [f"{p.target}: {problem}" for p in adapter.pairs if p.target in targets
           for problem in (mismatch(p, targets[p.target]),) if problem]
    matched = total - len(unmatched)
    counts = f"{matched * 2} of {tensors_total} tensors attach to base layers"
    if total == 0 or matched == 0:
        example = f" (e.g. {printable(unmatched[0])})" if unmatched else ""
        coverage = Check("coverage", FAIL, f"matches no layer: {counts}{example}; "
                         "it would silently do nothing")
    elif unmatched and adapter.format == "gguf":
        coverage = Check("coverage", FAIL, f"{counts}; llama.cpp refuses an adapter whose "
                         f"base tensor is missing: {printable(unmatched[0])}")
    elif unmatched:
        coverage = Check("coverage", WARN, f"partial coverage: {counts}; "
                         f"{len(unmatched) * 2} would be ignored (e.g. {printable(unmatched[0])})")
    else:
        layers = len({naming.layer_of(p.target) for p in adapter.pairs})
        coverage = Check("coverage", PASS, f"{counts} across {layers} layers")
    if bad:
        shapes_check = Check("shapes", FAIL, f"{len(bad)} layer(s) with wrong shapes, "
                             f"first {printable(bad[0], 300)}")
    elif matched:
        shapes_check = Check("shapes", PASS, "every attached tensor fits its layer")
    else:
        shapes_check = Check("shapes", FAIL, "nothing to compare: no layer matched")
    return [coverage, shapes_check]


def _openvino_coverage(adapter: AdapterInfo, base: BaseModelInfo) -> list[Check]:
    """Coverage by OpenVINO's own name-matching rule, on the IR's real layers."""
    from engine.formats import openvino_ir as openvino_attach

    if base.format != "openvino":
        detail = ("this base was added as a GGUF path, before `model add --backend openvino` "
                  "built a named IR: its layers have generated names (MatMul_46, ...), so no "
                  "LoRA tensor can attach; add the file again (`variant-studio model add NAME "
                  "--file X.gguf --backend openvino`) to build one (docs/formats.md)")
        return [Check("coverage", FAIL, f"0 of {adapter.tensor_count} tensors attach: {detail}"),
                Check("shapes", FAIL, "nothing to compare: no layer matched")]
    try:
        plan = openvino_attach.plan_for(Path(adapter.path), Path(base.path))
    except InspectionError as exc:
        return [Check("coverage", FAIL, exc.message),
                Check("shapes", FAIL, "nothing to compare: the model could not be read")]
    counts = plan.coverage()
    example = f" (e.g. {printable(plan.unused[0])})" if plan.unused else ""
    if plan.attached_tensors == 0 and not plan.bad_shapes:
        coverage = Check("coverage", FAIL, f"matches no layer: {counts}{example}; it would "
                         "silently do nothing")
    elif plan.unused:
        coverage = Check("coverage", WARN, f"partial coverage: {counts}; {len(plan.unused)} "
                         f"would be ignored{example}")
    else:
        coverage = Check("coverage", PASS, counts)
    if plan.bad_shapes:
        shapes_check = Check("shapes", FAIL, f"{len(plan.bad_shapes)} layer(s) with wrong "
                             f"shapes, first {printable(plan.bad_shapes[0], 300)}")
    elif plan.attachments:
        shapes_check = Check("shapes", PASS, "every attached tensor fits its OpenVINO layer")
    else:
        shapes_check = Check("shapes", FAIL, "nothing to compare: no layer matched")
    return [coverage, shapes_check]


def _rank(adapter: AdapterInfo) -> Check:
    if adapter.rank is None:
        return Check("rank", FAIL, "no rank: the adapter has no complete A/B pair")
    if adapter.rank < 1:
        return Check("rank", FAIL, "rank 0: the adapter has no effect")
    return Check("rank", PASS, f"rank {adapter.rank}, A and B agree")


def _alpha(adapter: AdapterInfo) -> Check:
    alpha = adapter.alpha
    if alpha is None:
        return Check("alpha", WARN, "no alpha declared: scale multiplies B·A directly")
    problem = _out_of_bounds("alpha", alpha, MAX_ALPHA, "")
    if problem:
        return Check("alpha", FAIL, problem)
    if alpha == 0:
        return Check("alpha", PASS, "alpha 0: scale multiplies B·A directly")
    ratio = alpha / adapter.rank if adapter.rank else alpha
    return Check("alpha", PASS, f"alpha {alpha:g} (x{ratio:g} per unit of scale)")


def _dtypes(adapter: AdapterInfo) -> Check:
    bad = [d for d in adapter.dtypes if d not in ADAPTER_DTYPES]
    if bad:
        return Check("dtype", FAIL, f"unsupported tensor type {bad[0]} (use F32, F16 or BF16)")
    return Check("dtype", PASS, ", ".join(adapter.dtypes))


def _values(adapter: AdapterInfo, progress: Progress | None = None,
            cancelled: CancelCheck | None = None) -> Check:
    """Weights with NaN or infinity would poison every token; refuse them up front."""
    try:
        path = Path(adapter.path)
        if path.stat().st_size > MAX_VALUE_SCAN_BYTES:
            return Check("values", WARN, "adapter too large to scan for NaN/inf")
        if adapter.format == "gguf":
            header = gguf_file.read_header(path)
            names = list(header.tensors)
            arrays = (gguf_file.read_tensor(header, name) for name in names)
            total = len(names)
        else:
            loaded = safetensors_file.load_tensors(safetensors_file.read_header(path))
            arrays, total = iter(loaded.values()), len(loaded)
        for done, array in enumerate(arrays, 1):
            if cancelled and cancelled():
                raise Cancelled(f"checking the weights of {path.name} was cancelled")
            if not np.isfinite(array).all():
                return Check("values", FAIL, "weights contain NaN or infinite values")
            if progress:
                progress(done, total)
    except InspectionError as exc:
        return Check("values", FAIL, exc.message)
    return Check("values", PASS, "all weights finite")


def _expected_base(adapter: AdapterInfo, base: BaseModelInfo, base_sha256: str,
                   strict: bool) -> Check:
    if adapter.base_sha256:
        if adapter.base_sha256 == base_sha256:
            return Check("expected base", PASS, "declared base digest matches")
        return Check("expected base", FAIL, f"adapter declares base sha256 "
                     f"{printable(adapter.base_sha256, 16)}, this base is {base_sha256[:16]}…")
    if strict:
        return Check("expected base", FAIL, "strict: a curated adapter must declare the "
                     "sha256 of its base")
    named = ""
    if adapter.base_name and adapter.base_name not in (base.name,):
        named = f"; it names base '{printable(adapter.base_name, 80)}'"
    return Check("expected base", WARN, f"no base digest declared: user-provided, "
                 f"unverified{named}")
