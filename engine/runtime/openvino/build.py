"""Build an OpenVINO IR with real layer names from a GGUF, offline.

Every OpenVINO base with adapters is made here from a GGUF (the curated default from the
embedded model, a user's file at `model add --backend openvino`), for the families OpenVINO
GenAI's GGUF reader knows and computes as llama.cpp does (`capabilities.SERVE_OPENVINO`,
from the architecture description: every number comes from `architecture.describe`):

1. refuse what OpenVINO cannot compute faithfully, with the reason, before any work;
2. dequantize: every tensor of the GGUF is read with our strict reader and written to
   an F16 GGUF (OpenVINO's GGUF reader is inaccurate on Q4_1, see docs/formats.md);
3. convert: OpenVINO GenAI reads that F16 GGUF and saves the IR, tokenizer and
   detokenizer (`LLMPipeline(..., enable_save_ov_model=True)`);
4. name: every decoder projection MatMul is renamed the way optimum-intel names it
   (`__module.model.layers.N.self_attn.q_proj/aten::linear/MatMul`), from the graph's
   structure and shapes, never from its position (see `name_projections`), and the
   result is cross-checked against the weight constants' names where they have any;
5. RoPE: the reader's rotary table (a constant of inverse frequencies, saved as f16 and
   blind to Llama 3's `rope_freqs` and to linear scaling) is replaced by llama.cpp's own
   `theta_i = base^(-2i/d) / rope_freqs[i] * freq_scale` in f32 (`set_rope_table`);
6. describe: `config.json`, `tokenizer_config.json` (chat template, special tokens)
   and `generation_config.json` are written from the description and the GGUF metadata;
7. publish: the folder is renamed into the cache in one step, under a file lock, so a
   crash or a second process never leaves a half-built model behind.
8. compress: the weight-compressed profiles (int4 `fast`, int8 `fast-int8`) are made
   from that IR with NNCF, each cached under its own key (`compress.py`).

The build cache lives in `<data>/cache/openvino` unless `VARIANT_STUDIO_OPENVINO_CACHE`
names another directory (tests share one per session). Only the engine process runs
steps 3-5: this module imports OpenVINO lazily, inside the functions that need it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from dataclasses import field as dataclass_field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import digest
from engine.errors import Cancelled, RefusedError
from engine.formats import architecture, capabilities, gguf_file
from engine.formats.architecture import (
    ATTN_K,
    ATTN_OUT,
    ATTN_Q,
    ATTN_V,
    FFN_DOWN,
    FFN_GATE,
    FFN_UP,
    Model,
)
from engine.runtime.openvino.common import RECIPE, version_token, weight_constant
from engine.state import paths
from engine.state.statefile import write_json_atomic

CACHE_ENV = "VARIANT_STUDIO_OPENVINO_CACHE"
DEFAULT_OPENVINO_MODEL_NAME = "smollm2-135m-instruct-openvino"
MANIFEST = "build.json"
IR_FOLDER = "ir"
F16_FILE = "model-f16.gguf"
IR_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml",
            "openvino_tokenizer.bin", "openvino_detokenizer.xml", "openvino_detokenizer.bin")

Progress = Callable[[str, float], None]
CancelCheck = Callable[[], bool]

# Where each projection sits in a decoder layer of separate q/k/v and gate/up/down (the
# layout of every family GenAI's reader builds), counted in projection MatMuls upstream
# of its input: q/k/v read the layer input (0 upstream in this layer), o reads attention
# (3), gate/up read the post-attention norm (4), down reads the MLP product (6). The next
# layer starts at 7.
_LAYER_SPAN = 7
_SLOTS = {0: 3, 3: 1, 4: 2, 6: 1}
_ACTIVATIONS = ("Swish", "Gelu", "Sigmoid", "HSwish", "HSigmoid", "Mish")
# How far downstream of a projection its rotary multiply and its KV-cache Assign may be.
# The path to the rotary multiply grows with what sits between: a reshape and transpose
# (3 hops), a bias Add (4), a per-head q/k RMSNorm (5-6); walks stop at the next MatMul
# and at attention, so they never leave the layer.
_ROTARY_HOPS = 8
_CACHE_HOPS = 12
_WALL = ("MatMul", "ScaledDotProductAttention", "Assign", "Result")
_CONST_NAMES = (
    re.compile(r"^model\.layers\[(\d{1,5})\]\.((?:self_attn|mlp)\.[a-z_]+)\.weight"),
    re.compile(r"^model\.layers\.(\d{1,5})\.((?:self_attn|mlp)\.[a-z_]+)\.weight"),
)


def openvino_version() -> str:
    try:
        return metadata.version("openvino-genai")
    except metadata.PackageNotFoundError:
        return "missing"


def cache_root(create: bool = True) -> Path:
    """The OpenVINO build cache (created if missing, unless `create` is false)."""
    override = os.environ.get(CACHE_ENV)
    root = Path(override) if override else paths.cache_dir(create) / "openvino"
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return root


def build_key(source_sha256: str) -> str:
    return f"{source_sha256[:16]}-{RECIPE}-ov{version_token(openvino_version(), 40)}"


@dataclass(frozen=True)
class NamingReport:
    """What `name_projections` found and renamed."""

    layers: int
    renamed: int
    cross_checked: int  # renamed projections whose weight constant named the same module
    hidden: int
    ffn: int
    q_out: int
    kv_out: int
    # The rotary tables replaced by llama.cpp's (`set_rope_table`) and what they hold.
    rope_tables: int = 0
    rope: str = ""


@dataclass(frozen=True)
class BuildResult:
    folder: str  # the IR folder to register as the model path
    f16_gguf: str
    source_path: str
    source_sha256: str
    recipe: str
    openvino_version: str
    seconds: float
    built: bool  # False when the build was found in the cache
    naming: NamingReport
    # The compressed profiles (`compress.ProfileBuild.to_dict()`), by profile name.
    profiles: dict[str, Any] = dataclass_field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> BuildResult:
        fields = dict(data)
        fields["naming"] = NamingReport(**fields["naming"])
        return BuildResult(**fields)


def cached_build(source_sha256: str) -> BuildResult | None:
    """A finished build of this source in the cache, its compressed profiles included,
    or None (no OpenVINO needed).

    Only reads: listing a fresh catalog asks this and must leave the disk as it was.
    """
    from engine.runtime.openvino import compress

    exact = _cached_exact(source_sha256)
    if exact is None:
        return None
    root = cache_root(create=False)
    profiles = {}
    for name in compress.COMPRESSED:
        found = compress.cached_profile(root, source_sha256, name, exact.openvino_version)
        if found is None:
            return None
        profiles[name] = found.to_dict()
    return BuildResult(**{**asdict(exact), "naming": exact.naming, "profiles": profiles})


def _cached_exact(source_sha256: str) -> BuildResult | None:
    """The finished F16 build (the exact profile) of this source in the cache, or None."""
    folder = cache_root(create=False) / build_key(source_sha256)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        result = BuildResult.from_dict(manifest)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if result.source_sha256 != source_sha256 or result.recipe != RECIPE:
        return None
    ir = folder / IR_FOLDER
    if not all((ir / name).is_file() for name in IR_FILES):
        return None
    # The manifest records the paths at build time; the cache may have moved since.
    return BuildResult(**{**asdict(result), "naming": result.naming, "folder": str(ir),
                          "f16_gguf": str(folder / F16_FILE), "built": False})


def build_from_gguf(source: Path, progress: Progress | None = None,
                    cancelled: CancelCheck | None = None, profiles: bool = True
                    ) -> BuildResult:
    """Build (or find in the cache) the named OpenVINO IR of a GGUF, and (with `profiles`)
    its compressed profiles. A file OpenVINO cannot compute faithfully is refused first."""
    from engine.runtime.openvino import compress

    report = progress or (lambda stage, fraction: None)
    stop = cancelled or (lambda: False)
    source = Path(source)
    describe_for_openvino(source)  # the reason, before the file is even hashed
    report("verifying source", 0.0)
    source_sha = digest.content_digest(source, lambda d, t: report("verifying source",
                                                                     d / max(t, 1)), stop)
    root = cache_root()
    result = _cached_exact(source_sha) or _build_exact(source, source_sha, root, report,
                                                       stop)
    built = {}
    if profiles:
        built = compress.ensure_profiles(root, source, source_sha, Path(result.folder),
                                         result.openvino_version, report, stop)
    report("done", 1.0)
    return BuildResult(**{**asdict(result), "naming": result.naming,
                          "profiles": {k: v.to_dict() for k, v in built.items()}})


def describe_for_openvino(source: Path, header: gguf_file.GgufHeader | None = None
                          ) -> Model:
    """The description of a GGUF OpenVINO computes as llama.cpp does, or a RefusedError
    with the reason (`capabilities.SERVE_OPENVINO`: the family, its RoPE, its layout).
    `header`: the file's strict header, when the caller read it already."""
    # Strict checks before anything native.
    header = header or gguf_file.read_header(Path(source))
    for found in capabilities.for_header(header):
        if found.name == capabilities.SERVE_OPENVINO and not found.ok:
            raise RefusedError(f"{Path(source).name}: OpenVINO cannot compute this file as "
                               f"llama.cpp does, so it is not added: {found.reason}")
    return architecture.describe(header)


def _build_exact(source: Path, source_sha: str, root: Path, report: Progress,
                 stop: CancelCheck) -> BuildResult:
    """Build the F16 IR (the exact profile) into the cache, under its file lock."""
    import filelock

    key = build_key(source_sha)
    with filelock.FileLock(str(root / f".{key}.lock")):
        hit = _cached_exact(source_sha)  # another process may have built it meanwhile
        if hit is not None:
            return hit
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
        try:
            result = _build(source, source_sha, staging, report, stop)
            final = root / key
            if final.exists():
                shutil.rmtree(final)  # an incomplete leftover: no valid manifest
            result = BuildResult(**{**asdict(result), "naming": result.naming,
                                    "seconds": round(time.monotonic() - started, 2),
                                    "folder": str(final / IR_FOLDER),
                                    "f16_gguf": str(final / F16_FILE)})
            write_json_atomic(staging / MANIFEST, result.to_dict())
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return result


def _build(source: Path, source_sha: str, staging: Path, report: Progress,
           stop: CancelCheck) -> BuildResult:
    # One strict read of the file serves every step (the metadata with every array
    # kept: the F16 copy and the descriptions are written from it).
    header = gguf_file.read_header(source, keep_arrays=True)
    model = describe_for_openvino(source, header)
    table = rope_table(model, header)
    f16 = staging / F16_FILE
    dequantize_to_f16(source, f16, lambda f: report("dequantizing to F16", f), stop,
                      header)
    _check(stop)
    report("converting with OpenVINO", 0.0)
    convert_dir = staging / "convert"
    convert_dir.mkdir()
    os.link(f16, convert_dir / F16_FILE)
    _convert_with_openvino(convert_dir / F16_FILE)
    _check(stop)
    report("naming layers", 0.0)
    ir = staging / IR_FOLDER
    ir.mkdir()
    naming = _name_and_save(convert_dir / "openvino_model.xml", ir / "openvino_model.xml",
                            model, table)
    for name in IR_FILES[2:]:
        os.replace(convert_dir / name, ir / name)
    shutil.rmtree(convert_dir)
    _check(stop)
    report("describing", 0.0)
    write_descriptions(source, ir, model, header)
    return BuildResult(folder=str(ir), f16_gguf=str(f16), source_path=str(source),
                       source_sha256=source_sha, recipe=RECIPE,
                       openvino_version=openvino_version(), seconds=0.0, built=True,
                       naming=naming)


def _check(stop: CancelCheck) -> None:
    if stop():
        raise Cancelled("building the OpenVINO model was cancelled")


def exact_ir_for_gguf(source: Path, source_sha256: str) -> Path:
    """The named F16 IR of a GGUF (built into the cache if missing): how a record that
    holds a GGUF path on OpenVINO is served (records made before `model add` built the
    IR up front). A family or RoPE OpenVINO cannot compute is refused with the reason."""
    result = _cached_exact(source_sha256)
    if result is None:
        describe_for_openvino(source)
        result = _build_exact(Path(source), source_sha256, cache_root(),
                              lambda stage, fraction: None, lambda: False)
    return Path(result.folder)


# --------------------------------------------------------------------------- step 2


def _full_header(source: Path, header: gguf_file.GgufHeader | None
                 ) -> gguf_file.GgufHeader:
    """`header` if it kept every array's values, else the file read again so."""
    if header is not None and all(not isinstance(v, gguf_file.GgufArray) or
                                  v.values is not None for v in header.metadata.values()):
        return header
    return gguf_file.read_header(source, keep_arrays=True)


def _metadata_value(value: Any) -> Any:
    """A metadata value as gguf-py writes it (an array as the list of its values)."""
    return list(value.values) if isinstance(value, gguf_file.GgufArray) else value


def dequantize_to_f16(source: Path, target: Path, progress: Callable[[float], None],
                      cancelled: CancelCheck, header: gguf_file.GgufHeader | None = None
                      ) -> None:
    """Write `source` with every matrix as F16 (vectors stay F32), metadata unchanged
    (written from our strict header: `header`, when the caller read it with every array
    kept; the gguf package's own reader is not needed, nor a second parse)."""
    from gguf import GGUFValueType, GGUFWriter
    from gguf.constants import LlamaFileType

    header = _full_header(source, header)
    writer = GGUFWriter(str(target), str(header.get("general.architecture")))
    for name, value in header.metadata.items():
        if name in ("general.architecture", "general.alignment"):
            continue
        if name == "general.file_type":
            writer.add_uint32(name, int(LlamaFileType.MOSTLY_F16))
            continue
        if isinstance(value, gguf_file.GgufArray):
            # As gguf-py writes any list: the item type taken from the first value.
            writer.add_array(name, _metadata_value(value))
        else:
            writer.add_key_value(name, value, GGUFValueType[header.value_types[name].upper()])
    names = list(header.tensors)
    for index, name in enumerate(names):
        _check(cancelled)
        array = gguf_file.read_tensor(header, name)
        if not np.isfinite(array).all():
            raise RefusedError(f"{source.name}: tensor {name} has NaN or infinite values")
        writer.add_tensor(name, array.astype(np.float16) if array.ndim >= 2 else array)
        progress((index + 1) / len(names) * 0.8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    progress(1.0)


# --------------------------------------------------------------------------- step 3


def _convert_with_openvino(gguf_path: Path) -> None:
    """OpenVINO GenAI's GGUF reader: saves IR, tokenizer and detokenizer beside the file."""
    import openvino_genai

    pipeline = openvino_genai.LLMPipeline(str(gguf_path), "CPU", enable_save_ov_model=True)
    del pipeline
    for name in IR_FILES:
        if not (gguf_path.parent / name).is_file():
            raise RefusedError(f"OpenVINO did not write {name} when converting "
                               f"{gguf_path.name}")


# --------------------------------------------------------------------------- step 4


@dataclass(frozen=True)
class _Projection:
    name: str  # friendly name when found
    out_features: int
    in_features: int
    const_name: str


def name_projections(model: Any, description: Model) -> NamingReport:
    """Give each decoder projection MatMul optimum-intel's name, from structure alone.

    Per layer: q/k/v share the layer's normed input; o follows attention; gate/up share
    the post-attention norm; down follows the MLP product. Which group a projection
    belongs to is the number of projection MatMuls upstream of its input (see
    `_SLOTS`), so neither the order of `get_ordered_ops()` nor node ids matter. Inside
    a group: q/k are the rotary-embedded ones (their output meets a sin/cos table before
    the next MatMul or attention: through a bias Add or a per-head norm too), k/v are the
    ones whose output reaches the KV cache (an `Assign`); gate feeds the activation, up
    does not. The module names are the description's (`Model.module`). Where weight
    constants carry module names (OpenVINO's GGUF reader gives them), they must agree, or
    the build fails rather than serve a model whose adapters would land on the wrong layer.
    """
    ops = model.get_ordered_ops()
    projections: dict[str, _Projection] = {}
    nodes: dict[str, Any] = {}
    for op in ops:
        if op.get_type_name() != "MatMul" or op.get_input_size() != 2:
            continue
        const = weight_constant(op.input_value(1).get_node())
        if const is None:
            continue
        shape = list(const.get_output_shape(0))
        if len(shape) != 2:
            continue
        transpose_b = bool(op.get_attributes().get("transpose_b"))
        out_f, in_f = (shape[0], shape[1]) if transpose_b else (shape[1], shape[0])
        name = op.get_friendly_name()
        projections[name] = _Projection(name, int(out_f), int(in_f), const.get_friendly_name())
        nodes[name] = op
    bits = {name: 1 << i for i, name in enumerate(projections)}
    # One pass in topological order: which projections lie upstream of each node, and
    # whether it derives from sin/cos (a rotary table) without passing a projection.
    upstream: dict[str, int] = {}
    rope_table: dict[str, bool] = {}
    for op in ops:
        name = op.get_friendly_name()
        above = 0
        trig = op.get_type_name() in ("Sin", "Cos")
        for value in op.input_values():
            source = value.get_node().get_friendly_name()
            above |= upstream.get(source, 0) | bits.get(source, 0)
            trig = trig or rope_table.get(source, False)
        upstream[name] = above
        rope_table[name] = trig and above == 0
    groups: dict[int, list[str]] = {}
    for name, op in nodes.items():
        depth = bin(upstream[op.input_value(0).get_node().get_friendly_name()]).count("1")
        groups.setdefault(depth, []).append(name)

    renames: dict[str, str] = {}
    layer = 0
    depths = sorted(groups)
    for depth in depths:
        members = groups[depth]
        slot = depth - layer * _LAYER_SPAN
        if slot == 0 and depth == depths[-1] and len(members) == 1 and layer > 0:
            continue  # the output projection (lm_head) after the last decoder layer
        if slot not in _SLOTS or len(members) != _SLOTS[slot]:
            raise RefusedError(f"unsupported graph: {len(members)} projection(s) at depth "
                               f"{depth} do not fit a {description.family.title} decoder "
                               f"layer (layer {layer})")
        if slot == 0:
            for name, role in _attention_roles(members, nodes, rope_table).items():
                renames[name] = description.module(layer, role)
        elif slot == 3:
            renames[members[0]] = description.module(layer, ATTN_OUT)
        elif slot == 4:
            gates = [m for m in members if _feeds_activation(nodes[m])]
            if len(gates) != 1:
                raise RefusedError(f"unsupported graph: layer {layer} has no single gate "
                                   "projection feeding an activation")
            up = next(m for m in members if m != gates[0])
            renames[gates[0]] = description.module(layer, FFN_GATE)
            renames[up] = description.module(layer, FFN_UP)
        else:
            renames[members[0]] = description.module(layer, FFN_DOWN)
            layer += 1
    if layer != description.n_layer:
        raise RefusedError(f"structural naming found {layer} decoder layers, the model "
                           f"declares {description.n_layer}")
    cross_checked = 0
    for name, module in renames.items():
        declared = _module_from_constant(projections[name].const_name)
        if declared is not None:
            if declared != module:
                raise RefusedError(f"structural naming disagrees with the weights: "
                                   f"{name} looks like {module} but its weight is "
                                   f"{projections[name].const_name}")
            cross_checked += 1
        nodes[name].set_friendly_name(f"__module.{module}/aten::linear/MatMul")
    _check_shapes(renames, projections, description)
    by_module = {module: projections[name] for name, module in renames.items()}
    q = by_module.get(description.module(0, ATTN_Q))
    k = by_module.get(description.module(0, ATTN_K))
    gate = by_module.get(description.module(0, FFN_GATE))
    return NamingReport(layers=layer, renamed=len(renames), cross_checked=cross_checked,
                        hidden=q.in_features if q else 0, ffn=gate.out_features if gate else 0,
                        q_out=q.out_features if q else 0, kv_out=k.out_features if k else 0)


def _check_shapes(renames: dict[str, str], projections: dict[str, _Projection],
                  description: Model) -> None:
    """Every named projection has the (out, in) shape the description gives its role: a
    structure read wrongly (q taken for k) cannot pass with the heads of this file."""
    from engine.formats import naming

    for name, module in renames.items():
        role = naming.role_of(module)
        found = projections[name]
        expected = description.projection_shape(role) if role else None
        if expected != (found.out_features, found.in_features):
            raise RefusedError(f"unsupported graph: {module} is {found.out_features}x"
                               f"{found.in_features}, the model says {expected}")


def _module_from_constant(name: str) -> str | None:
    for pattern in _CONST_NAMES:
        match = pattern.match(name)
        if match:
            return f"model.layers.{int(match.group(1))}.{match.group(2)}"
    return None


def _downstream(node: Any, hops: int, wall: tuple[str, ...] = ()) -> list[Any]:
    """Nodes within `hops` edges downstream of `node` (each once), not walking past a
    node whose type is in `wall` (it is listed, its consumers are not)."""
    found = []
    seen = {node.get_friendly_name()}
    frontier = [node]
    for _ in range(hops):
        nxt = []
        for current in frontier:
            for output in current.outputs():
                for target in output.get_target_inputs():
                    child = target.get_node()
                    if child.get_friendly_name() in seen:
                        continue
                    seen.add(child.get_friendly_name())
                    found.append(child)
                    if child.get_type_name() not in wall:
                        nxt.append(child)
        frontier = nxt
    return found


def _attention_roles(members: list[str], nodes: dict[str, Any],
                     rope_table: dict[str, bool]) -> dict[str, str]:
    def roped(name: str) -> bool:
        for node in _downstream(nodes[name], _ROTARY_HOPS, _WALL):
            if node.get_type_name() == "Multiply" and any(
                    rope_table.get(v.get_node().get_friendly_name(), False)
                    for v in node.input_values()):
                return True
        return False

    def cached(name: str) -> bool:
        return any(n.get_type_name() == "Assign"
                   for n in _downstream(nodes[name], _CACHE_HOPS, _WALL))

    flags = {m: (roped(m), cached(m)) for m in members}
    roles = {}
    for name, (is_roped, is_cached) in flags.items():
        if is_roped and not is_cached:
            roles[name] = ATTN_Q
        elif is_roped and is_cached:
            roles[name] = ATTN_K
        elif is_cached:
            roles[name] = ATTN_V
    if sorted(roles.values()) != sorted((ATTN_Q, ATTN_K, ATTN_V)):
        raise RefusedError("unsupported graph: cannot tell q, k and v apart (rotary and "
                           f"cache flags {sorted(flags.values())})")
    return roles


def _feeds_activation(node: Any) -> bool:
    return any(n.get_type_name() in _ACTIVATIONS for n in _downstream(node, 1))


# --------------------------------------------------------------------------- step 5


def rope_table(model: Model, header: Any) -> np.ndarray:
    """llama.cpp's inverse frequencies for this file (ggml_rope_ext without YaRN):
    theta_i = base^(-2i/d), divided by Llama 3's `rope_freqs[i]` where the file has them,
    times freq_scale = 1/factor under linear scaling. Computed in float64."""
    table = np.asarray(model.rope.inv_freq(), dtype=np.float64) * model.rope.freq_scale
    if model.rope.freq_factors:
        factors = gguf_file.read_tensor(header, "rope_freqs.weight").astype(np.float64)
        if factors.shape != table.shape or not np.all(np.isfinite(factors)) or np.any(
                factors <= 0):
            raise RefusedError(f"{header.path.name}: rope_freqs.weight must hold "
                               f"{table.size} positive factors")
        table = table / factors
    return table


def _rope_text(model: Model) -> str:
    """What the rotary table holds, for the build's report."""
    text = f"theta_i = {model.rope.base:g}^(-2i/{model.rope.dims})"
    if model.rope.freq_factors:
        text += " / rope_freqs[i]"
    if model.rope.factor != 1.0:
        text += f" x 1/{model.rope.factor:g}"
    return text + " (f32)"


def set_rope_table(model: Any, description: Model, table: np.ndarray) -> int:
    """Replace the GGUF reader's rotary table by llama.cpp's (`rope_table`).

    The reader builds the rotary embedding from one constant of shape [1, d/2, 1] holding
    base^(-2i/d): broadcast, multiplied by the positions (a MatMul), then cos and sin. It
    reads neither Llama 3's `rope_freqs` nor a linear scaling factor, and its saved IR keeps
    the constant as f16 (far enough from llama.cpp's f32 angles to change the next-token
    distribution beyond ~1000 positions). Every such constant that feeds a sin/cos table
    is checked to hold the file's base^(-2i/d) and is replaced by `table` in f32; the number
    replaced is returned (at least one, or the graph is not the one this build expects).
    """
    from openvino import opset13 as ops

    half = description.rope.dims // 2
    plain = np.asarray(description.rope.inv_freq(), dtype=np.float64)
    replacement = ops.constant(table.astype(np.float32).reshape(1, half, 1))
    replaced = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Constant" or list(op.get_output_shape(0)) != [1, half, 1]:
            continue
        # The constant, or its f16 -> f32 Convert, is what the rotary subgraph reads.
        feed = op
        users = [t.get_node() for t in op.output(0).get_target_inputs()]
        if len(users) == 1 and users[0].get_type_name() == "Convert":
            feed = users[0]
        if not _feeds_trig(feed):
            continue
        if not _holds(op.get_data().astype(np.float64).reshape(-1), plain):
            raise RefusedError("unsupported graph: the rotary table OpenVINO built does not "
                               f"hold {description.rope.base:g}^(-2i/{description.rope.dims})")
        for target in list(feed.output(0).get_target_inputs()):
            target.replace_source_output(replacement.output(0))
        replaced += 1
    if not replaced:
        raise RefusedError("unsupported graph: no rotary table found to correct")
    return replaced


def _holds(values: np.ndarray, plain: np.ndarray) -> bool:
    """`values` are `plain` as a float32 or a float16 constant holds them: f16 rounding
    (to within one f16 step: the reader rounds float32 values, we float64 ones) covers
    the subnormal f16 values a large base's slowest frequencies fall to (1e6^(-62/64) is
    1.5e-6, below f16's smallest normal 6.1e-5)."""
    if values.shape != plain.shape:
        return False
    if np.allclose(values, plain, rtol=1e-6, atol=0.0):
        return True
    halves = plain.astype(np.float16)
    steps = np.spacing(np.abs(halves)).astype(np.float64)
    return bool(np.all(np.abs(values - halves.astype(np.float64)) <= steps))


def _feeds_trig(node: Any) -> bool:
    """`node` reaches a Sin or Cos within a few hops (broadcast, MatMul, transpose, concat)."""
    return any(n.get_type_name() in ("Sin", "Cos") for n in _downstream(node, 6))


def _name_and_save(source_xml: Path, target_xml: Path, description: Model,
                   table: np.ndarray) -> NamingReport:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(source_xml))
    report = name_projections(model, description)
    tables = set_rope_table(model, description, table)
    model.validate_nodes_and_infer_types()
    # No fp16 compression on save: the rotary table must stay f32 (the reader's other
    # constants are already stored as f16 and stay as they are).
    ov.save_model(model, str(target_xml), compress_to_fp16=False)
    return NamingReport(**{**asdict(report), "rope_tables": tables,
                           "rope": _rope_text(description)})


# --------------------------------------------------------------------------- step 6


def write_descriptions(source: Path, ir: Path, model: Model | None = None,
                       header: gguf_file.GgufHeader | None = None) -> None:
    """config.json, tokenizer_config.json and generation_config.json from the description
    (`architecture.describe`) and the GGUF's tokenizer metadata (`header`: the file's
    strict header with every array kept, when the caller has one)."""
    header = _full_header(source, header)
    described = model or architecture.describe(header)

    def value(key: str, default: Any = None) -> Any:
        return _metadata_value(header.metadata[key]) if key in header.metadata else default

    tokens = value("tokenizer.ggml.tokens", [])
    bos = value("tokenizer.ggml.bos_token_id")
    eos = value("tokenizer.ggml.eos_token_id")
    family = described.family
    config: dict[str, Any] = {
        "architectures": [family.hf_class],
        "model_type": family.hf_model_type,
        "_name_or_path": str(value("general.name", source.stem)),
        "num_hidden_layers": described.n_layer,
        "hidden_size": described.n_embd,
        "intermediate_size": described.n_ff,
        "num_attention_heads": described.n_head,
        "num_key_value_heads": described.n_head_kv,
        "head_dim": described.head_dim,
        "max_position_embeddings": described.n_ctx_train,
        "rms_norm_eps": described.rms_eps,
        "rope_theta": described.rope.base,
        "vocab_size": len(tokens),
        "bos_token_id": int(bos) if bos is not None else None,
        "eos_token_id": int(eos) if eos is not None else None,
        "tie_word_embeddings": described.tied_output,
        "torch_dtype": "float16",
    }
    if described.rope.factor != 1.0:
        config["rope_scaling"] = {"rope_type": described.rope.scaling,
                                  "factor": described.rope.factor}
    write_json_atomic(ir / "config.json", config)
    tokenizer: dict[str, Any] = {
        "add_bos_token": bool(value("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(value("tokenizer.ggml.add_eos_token", False)),
    }
    for key, token_id in (("bos_token", bos), ("eos_token", eos)):
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            tokenizer[key] = str(tokens[int(token_id)])
    template = value("tokenizer.chat_template")
    if isinstance(template, str):
        tokenizer["chat_template"] = template
    write_json_atomic(ir / "tokenizer_config.json", tokenizer)
    write_json_atomic(ir / "generation_config.json",
                      {"bos_token_id": config["bos_token_id"],
                       "eos_token_id": config["eos_token_id"]})
