"""Build an OpenVINO IR with real layer names from a llama-family GGUF, offline.

The curated OpenVINO default base is made from the embedded GGUF, inside the project,
with no model hub:

1. dequantize: every tensor of the GGUF is read with our strict reader and written to
   an F16 GGUF (OpenVINO's GGUF reader is inaccurate on Q4_1, see docs/formats.md);
2. convert: OpenVINO GenAI reads that F16 GGUF and saves the IR, tokenizer and
   detokenizer (`LLMPipeline(..., enable_save_ov_model=True)`);
3. name: every decoder projection MatMul is renamed the way optimum-intel names it
   (`__module.model.layers.N.self_attn.q_proj/aten::linear/MatMul`), from the graph's
   structure and shapes, never from its position (see `name_projections`), and the
   result is cross-checked against the weight constants' names where they have any;
4. describe: `config.json`, `tokenizer_config.json` (chat template, special tokens)
   and `generation_config.json` are written from the GGUF's metadata;
5. publish: the folder is renamed into the cache in one step, under a file lock, so a
   crash or a second process never leaves a half-built model behind.
6. compress: the weight-compressed profiles (int4 `fast`, int8 `fast-int8`) are made
   from that IR with NNCF, each cached under its own key (`compress.py`).

The build cache lives in `<data>/cache/openvino` unless `VARIANT_STUDIO_OPENVINO_CACHE`
names another directory (tests share one per session). Only the engine process runs
steps 2-3: this module imports OpenVINO lazily, inside the functions that need it.
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
from engine.formats import gguf_file
from engine.state import paths
from engine.state.statefile import write_json_atomic

RECIPE = "f16-structural-v1"
CACHE_ENV = "VARIANT_STUDIO_OPENVINO_CACHE"
DEFAULT_OPENVINO_MODEL_NAME = "smollm2-135m-instruct-openvino"
MANIFEST = "build.json"
IR_FOLDER = "ir"
F16_FILE = "model-f16.gguf"
IR_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml",
            "openvino_tokenizer.bin", "openvino_detokenizer.xml", "openvino_detokenizer.bin")

Progress = Callable[[str, float], None]
CancelCheck = Callable[[], bool]

# Where each projection sits in a llama decoder layer, counted in projection MatMuls
# upstream of its input: q/k/v read the layer input (0 upstream in this layer), o
# reads attention (3), gate/up read the post-attention norm (4), down reads the MLP
# product (6). The next layer starts at 7.
_LAYER_SPAN = 7
_SLOTS = {0: 3, 3: 1, 4: 2, 6: 1}
_ACTIVATIONS = ("Swish", "Gelu", "Sigmoid", "HSwish", "HSigmoid", "Mish")
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


def version_token(version: str, length: int) -> str:
    """A version string as it may stand in a cache folder's name."""
    return re.sub(r"[^0-9A-Za-z.]", "_", version)[:length]


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
                    cancelled: CancelCheck | None = None) -> BuildResult:
    """Build (or find in the cache) the named OpenVINO IR of a llama-family GGUF, and
    its compressed profiles."""
    from engine.runtime.openvino import compress

    report = progress or (lambda stage, fraction: None)
    stop = cancelled or (lambda: False)
    source = Path(source)
    report("verifying source", 0.0)
    source_sha = digest.content_digest(source, lambda d, t: report("verifying source",
                                                                     d / max(t, 1)), stop)
    root = cache_root()
    result = _cached_exact(source_sha) or _build_exact(source, source_sha, root, report,
                                                       stop)
    profiles = compress.ensure_profiles(root, source, source_sha, Path(result.folder),
                                        result.openvino_version, report, stop)
    report("done", 1.0)
    return BuildResult(**{**asdict(result), "naming": result.naming,
                          "profiles": {k: v.to_dict() for k, v in profiles.items()}})


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
    header = gguf_file.read_header(source)  # strict checks before anything native
    arch = header.get("general.architecture")
    if arch != "llama":
        raise RefusedError(f"{source.name}: architecture {arch!r}; the OpenVINO builder "
                           "knows the llama layer structure only")
    f16 = staging / F16_FILE
    dequantize_to_f16(source, f16, lambda f: report("dequantizing to F16", f), stop)
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
                            int(header.get("llama.block_count", 0)))
    for name in IR_FILES[2:]:
        os.replace(convert_dir / name, ir / name)
    shutil.rmtree(convert_dir)
    _check(stop)
    report("describing", 0.0)
    write_descriptions(source, ir)
    return BuildResult(folder=str(ir), f16_gguf=str(f16), source_path=str(source),
                       source_sha256=source_sha, recipe=RECIPE,
                       openvino_version=openvino_version(), seconds=0.0, built=True,
                       naming=naming)


def _check(stop: CancelCheck) -> None:
    if stop():
        raise Cancelled("building the OpenVINO model was cancelled")


def ir_for_gguf(source: Path, source_sha256: str) -> Path:
    """A GGUF served by OpenVINO as a plain base: its IR, converted once into the cache.

    OpenVINO's GGUF reader writes the IR beside the file it reads, so it reads a link
    in a staging folder of the cache, never the user's folder. The layers keep their
    generated names: adapters cannot attach (validation says so up front).
    """
    import filelock

    root = cache_root()
    key = f"gguf-{source_sha256[:16]}-ov{build_key(source_sha256).rsplit('-ov', 1)[1]}"
    final = root / key
    if all((final / name).is_file() for name in IR_FILES):
        return final
    with filelock.FileLock(str(root / f".{key}.lock")):
        if all((final / name).is_file() for name in IR_FILES):
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
        try:
            link = staging / "model.gguf"
            os.symlink(Path(source).resolve(), link)
            _convert_with_openvino(link)
            link.unlink()
            write_descriptions(Path(source), staging)
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final


# --------------------------------------------------------------------------- step 1


def dequantize_to_f16(source: Path, target: Path, progress: Callable[[float], None],
                      cancelled: CancelCheck) -> None:
    """Write `source` with every matrix as F16 (vectors stay F32), metadata unchanged."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.constants import LlamaFileType

    header = gguf_file.read_header(source)  # our strict parse comes first
    reader = GGUFReader(str(source))
    writer = GGUFWriter(str(target), str(header.get("general.architecture")))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        if name == "general.file_type":
            writer.add_uint32(name, int(LlamaFileType.MOSTLY_F16))
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), kind)
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


# --------------------------------------------------------------------------- step 2


def _convert_with_openvino(gguf_path: Path) -> None:
    """OpenVINO GenAI's GGUF reader: saves IR, tokenizer and detokenizer beside the file."""
    import openvino_genai

    pipeline = openvino_genai.LLMPipeline(str(gguf_path), "CPU", enable_save_ov_model=True)
    del pipeline
    for name in IR_FILES:
        if not (gguf_path.parent / name).is_file():
            raise RefusedError(f"OpenVINO did not write {name} when converting "
                               f"{gguf_path.name}")


# --------------------------------------------------------------------------- step 3


@dataclass(frozen=True)
class _Projection:
    name: str  # friendly name when found
    out_features: int
    in_features: int
    const_name: str


def _weight_constant(node: Any) -> Any | None:
    """The Constant behind a MatMul's weight input (through decompression Converts)."""
    for _ in range(4):
        kind = node.get_type_name()
        if kind == "Constant":
            return node
        if kind != "Convert":
            return None
        node = node.input_value(0).get_node()
    return None


def name_projections(model: Any, expect_layers: int = 0) -> NamingReport:
    """Give each decoder projection MatMul optimum-intel's name, from structure alone.

    Per layer: q/k/v share the layer's normed input; o follows attention; gate/up share
    the post-attention norm; down follows the MLP product. Which group a projection
    belongs to is the number of projection MatMuls upstream of its input (see
    `_SLOTS`), so neither the order of `get_ordered_ops()` nor node ids matter. Inside
    a group: q/k are the rotary-embedded ones (their output meets a sin/cos table
    within three hops), k/v are the ones whose output reaches the KV cache (an
    `Assign`); gate feeds the activation, up does not. Where weight constants carry
    module names (OpenVINO's GGUF reader gives them), they must agree, or the build
    fails rather than serve a model whose adapters would land on the wrong layer.
    """
    ops = model.get_ordered_ops()
    projections: dict[str, _Projection] = {}
    nodes: dict[str, Any] = {}
    for op in ops:
        if op.get_type_name() != "MatMul" or op.get_input_size() != 2:
            continue
        const = _weight_constant(op.input_value(1).get_node())
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
                               f"{depth} do not fit a llama decoder layer (layer {layer})")
        prefix = f"model.layers.{layer}"
        if slot == 0:
            roles = _attention_roles(members, nodes, rope_table)
            for name, role in roles.items():
                renames[name] = f"{prefix}.self_attn.{role}"
        elif slot == 3:
            renames[members[0]] = f"{prefix}.self_attn.o_proj"
        elif slot == 4:
            gates = [m for m in members if _feeds_activation(nodes[m])]
            if len(gates) != 1:
                raise RefusedError(f"unsupported graph: layer {layer} has no single gate "
                                   "projection feeding an activation")
            up = next(m for m in members if m != gates[0])
            renames[gates[0]] = f"{prefix}.mlp.gate_proj"
            renames[up] = f"{prefix}.mlp.up_proj"
        else:
            renames[members[0]] = f"{prefix}.mlp.down_proj"
            layer += 1
    if expect_layers and layer != expect_layers:
        raise RefusedError(f"structural naming found {layer} decoder layers, the model "
                           f"declares {expect_layers}")
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
    by_module = {module: projections[name] for name, module in renames.items()}
    q = by_module.get("model.layers.0.self_attn.q_proj")
    k = by_module.get("model.layers.0.self_attn.k_proj")
    gate = by_module.get("model.layers.0.mlp.gate_proj")
    return NamingReport(layers=layer, renamed=len(renames), cross_checked=cross_checked,
                        hidden=q.in_features if q else 0, ffn=gate.out_features if gate else 0,
                        q_out=q.out_features if q else 0, kv_out=k.out_features if k else 0)


def _module_from_constant(name: str) -> str | None:
    for pattern in _CONST_NAMES:
        match = pattern.match(name)
        if match:
            return f"model.layers.{int(match.group(1))}.{match.group(2)}"
    return None


def _downstream(node: Any, hops: int) -> list[Any]:
    found = []
    frontier = [node]
    for _ in range(hops):
        nxt = []
        for current in frontier:
            for output in current.outputs():
                for target in output.get_target_inputs():
                    nxt.append(target.get_node())
        found.extend(nxt)
        frontier = nxt
    return found


def _attention_roles(members: list[str], nodes: dict[str, Any],
                     rope_table: dict[str, bool]) -> dict[str, str]:
    def roped(name: str) -> bool:
        for node in _downstream(nodes[name], 3):
            if node.get_type_name() == "Multiply" and any(
                    rope_table.get(v.get_node().get_friendly_name(), False)
                    for v in node.input_values()):
                return True
        return False

    def cached(name: str) -> bool:
        return any(n.get_type_name() == "Assign" for n in _downstream(nodes[name], 8))

    flags = {m: (roped(m), cached(m)) for m in members}
    roles = {}
    for name, (is_roped, is_cached) in flags.items():
        if is_roped and not is_cached:
            roles[name] = "q_proj"
        elif is_roped and is_cached:
            roles[name] = "k_proj"
        elif is_cached:
            roles[name] = "v_proj"
    if sorted(roles.values()) != ["k_proj", "q_proj", "v_proj"]:
        raise RefusedError("unsupported graph: cannot tell q, k and v apart (rotary and "
                           f"cache flags {sorted(flags.values())})")
    return roles


def _feeds_activation(node: Any) -> bool:
    return any(n.get_type_name() in _ACTIVATIONS for n in _downstream(node, 1))


def _name_and_save(source_xml: Path, target_xml: Path, expect_layers: int) -> NamingReport:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(source_xml))
    report = name_projections(model, expect_layers)
    ov.save_model(model, str(target_xml))
    return report


# --------------------------------------------------------------------------- step 4


def write_descriptions(source: Path, ir: Path) -> None:
    """config.json, tokenizer_config.json and generation_config.json from GGUF metadata."""
    from gguf import GGUFReader

    header = gguf_file.read_header(source)
    reader = GGUFReader(str(source))

    def value(key: str, default: Any = None) -> Any:
        field = reader.fields.get(key)
        return field.contents() if field is not None else default

    tokens = value("tokenizer.ggml.tokens", [])
    bos = value("tokenizer.ggml.bos_token_id")
    eos = value("tokenizer.ggml.eos_token_id")
    heads = int(value("llama.attention.head_count", 0))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_name_or_path": str(value("general.name", source.stem)),
        "num_hidden_layers": int(value("llama.block_count", 0)),
        "hidden_size": int(value("llama.embedding_length", 0)),
        "intermediate_size": int(value("llama.feed_forward_length", 0)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(value("llama.attention.head_count_kv", heads)),
        "max_position_embeddings": int(value("llama.context_length", 0)),
        "rms_norm_eps": float(value("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(value("llama.rope.freq_base", 10000.0)),
        "vocab_size": len(tokens),
        "bos_token_id": int(bos) if bos is not None else None,
        "eos_token_id": int(eos) if eos is not None else None,
        "tie_word_embeddings": "output.weight" not in header.tensors,
        "torch_dtype": "float16",
    }
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
