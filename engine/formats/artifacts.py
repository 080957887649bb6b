"""Inspection of model and adapter artifacts, strict and bounded, with no native code.

`inspect_path` tells what a file or folder is and what it holds:
- a GGUF base model (architecture, sizes, tensor types, tokenizer, chat template),
- a GGUF LoRA adapter in llama.cpp's naming,
- a PEFT LoRA adapter (a `.safetensors` file or a folder with `adapter_config.json`),
- an OpenVINO IR model folder (XML/BIN, tokenizer, config).

Values are frozen so they can cross threads and processes. Structural problems in an
adapter (a missing half, an unknown suffix, disagreeing ranks) are recorded as
`problems` so validation can report them as named failed checks.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import InspectionError
from engine.formats import gguf_file, naming, openvino_ir, safetensors_file
from engine.formats.safeio import open_regular, printable, stat_regular

MAX_JSON_BYTES = 4 << 20
MAX_TEMPLATE_CHARS = 256 << 10


@dataclass(frozen=True)
class BaseModelInfo:
    path: str
    format: str  # "gguf" | "openvino"
    architecture: str
    name: str
    file_type: str
    tensor_types: tuple[tuple[str, int], ...]
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    context_length: int
    vocab_size: int
    tokenizer: str
    chat_template: str | None
    chat_template_sha256: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos: bool
    add_eos: bool
    # module path ("model.layers.0.self_attn.q_proj") -> (out_features, in_features)
    modules: tuple[tuple[str, tuple[int, int]], ...] = ()
    # GGUF tensor name -> ggml shape (ne[0] first); empty for OpenVINO models
    tensors: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def bos_policy(self) -> str:
        return f"add_bos={str(self.add_bos).lower()};bos={self.bos_token_id}"

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        return dict(self.modules)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.tensors)

    def summary(self) -> dict[str, Any]:
        """What the catalog stores and `show` prints (no per-tensor tables)."""
        return {
            "format": self.format,
            "architecture": self.architecture,
            "model_name": printable(self.name),
            "file_type": self.file_type,
            "tensor_types": dict(self.tensor_types),
            "block_count": self.block_count,
            "embedding_length": self.embedding_length,
            "feed_forward_length": self.feed_forward_length,
            "head_count": self.head_count,
            "head_count_kv": self.head_count_kv,
            "context_length": self.context_length,
            "vocab_size": self.vocab_size,
            "tokenizer": self.tokenizer,
            "chat_template_sha256": self.chat_template_sha256,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
        }


@dataclass(frozen=True)
class LoraPair:
    """One adapted layer: the target and the shapes of its two halves."""

    target: str  # GGUF: base tensor name; PEFT: module path without the PEFT prefix
    a_shape: tuple[int, ...]  # as stored (ggml order for GGUF, numpy order for PEFT)
    b_shape: tuple[int, ...]
    dtype: str
    rank: int


@dataclass(frozen=True)
class AdapterInfo:
    path: str
    format: str  # "gguf" | "peft"
    backend: str  # "llama" | "openvino"
    architecture: str | None
    alpha: float | None
    rank: int | None
    pairs: tuple[LoraPair, ...]
    tensor_count: int
    dtypes: tuple[str, ...]
    base_name: str | None
    base_sha256: str | None
    problems: tuple[str, ...] = ()
    config_path: str | None = None  # adapter_config.json beside a PEFT adapter
    target_modules: tuple[str, ...] = ()
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def roles(self) -> tuple[str, ...]:
        found = {naming.role_of(p.target) for p in self.pairs}
        return tuple(r for r in naming.PROJECTION_ROLES if r in found)

    def summary(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "architecture": self.architecture,
            "alpha": self.alpha,
            "rank": self.rank,
            "targets": list(self.roles),
            "target_modules": list(self.target_modules),
            "adapted_tensors": len(self.pairs),
            "tensor_count": self.tensor_count,
            "dtypes": list(self.dtypes),
            "expected_base_name": printable(self.base_name) if self.base_name else None,
            "expected_base_sha256": self.base_sha256,
            "target_shapes": {
                p.target: {"a": list(p.a_shape), "b": list(p.b_shape)} for p in self.pairs[:8]
            },
        }


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_json_file(path: Path, what: str) -> Any:
    handle, st = open_regular(path)
    with handle:
        if st.size > MAX_JSON_BYTES:
            raise InspectionError(f"{path.name}: {what} is larger than {MAX_JSON_BYTES} bytes")
        raw = handle.read(MAX_JSON_BYTES + 1)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InspectionError(f"{path.name}: {what} is not valid JSON ({exc})") from None
    except RecursionError:  # json's C decoder recurses once per nesting level
        raise InspectionError(f"{path.name}: {what} is nested too deeply") from None


# --------------------------------------------------------------------------- GGUF


def _int(header: gguf_file.GgufHeader, key: str, default: int | None = None) -> int | None:
    value = header.typed(key, ("uint8", "int8", "uint16", "int16", "uint32", "int32",
                               "uint64", "int64"), "an integer")
    if value is None:
        return default
    return int(value)


def _str(header: gguf_file.GgufHeader, key: str) -> str | None:
    return header.typed(key, ("string",), "a string")


def _bool(header: gguf_file.GgufHeader, key: str, default: bool) -> bool:
    value = header.typed(key, ("bool",), "a bool")
    return default if value is None else bool(value)


def inspect_gguf(path: Path) -> BaseModelInfo | AdapterInfo:
    header = gguf_file.read_header(path)
    kind = _str(header, "general.type")
    if kind == "adapter":
        return _gguf_adapter(header)
    if kind not in (None, "model"):
        raise InspectionError(f"{path.name}: unknown general.type '{printable(kind)}'")
    return _gguf_base(header)


def _gguf_base(header: gguf_file.GgufHeader) -> BaseModelInfo:
    name = header.path.name
    arch = _str(header, "general.architecture")
    if not arch:
        raise InspectionError(f"{name}: no general.architecture: not a model llama.cpp can load")
    if not re.fullmatch(r"[a-z0-9_]{1,32}", arch):
        raise InspectionError(f"{name}: implausible architecture '{printable(arch)}'")
    if not header.tensors:
        raise InspectionError(f"{name}: a model with no tensors (header only?)")

    def arch_int(key: str) -> int:
        value = _int(header, f"{arch}.{key}", 0) or 0
        if value < 0 or value > 1 << 24:
            raise InspectionError(f"{name}: {arch}.{key} = {value} is out of range")
        return value

    block_count = arch_int("block_count")
    if block_count == 0 or block_count > 4096:
        raise InspectionError(f"{name}: implausible {arch}.block_count {block_count}")
    for key in ("embedding_length", "attention.head_count", "attention.head_count_kv"):
        if f"{arch}.{key}" in header.metadata and arch_int(key) == 0:
            raise InspectionError(f"{name}: {arch}.{key} = 0 is implausible")
    embeddings = header.tensors.get("token_embd.weight")
    width = arch_int("embedding_length")
    if embeddings is not None and width and embeddings.shape[0] != width:
        raise InspectionError(f"{name}: {arch}.embedding_length = {width} disagrees with "
                              f"token_embd.weight ({embeddings.shape[0]} wide)")
    template = _str(header, "tokenizer.chat_template")
    if template is not None and len(template) > MAX_TEMPLATE_CHARS:
        raise InspectionError(f"{name}: chat template longer than {MAX_TEMPLATE_CHARS} chars")
    tokens = header.get("tokenizer.ggml.tokens")
    vocab = tokens.length if isinstance(tokens, gguf_file.GgufArray) else 0
    types = Counter(t.type_name for t in header.tensors.values())
    modules = []
    for tensor in header.tensors.values():
        module = naming.gguf_to_module(tensor.name, arch)
        if module and len(tensor.shape) == 2:
            modules.append((module, (tensor.shape[1], tensor.shape[0])))
    file_type = _int(header, "general.file_type")
    return BaseModelInfo(
        path=str(header.path),
        format="gguf",
        architecture=arch,
        name=_str(header, "general.name") or header.path.stem,
        file_type=_file_type_name(file_type, types),
        tensor_types=tuple(sorted(types.items())),
        block_count=block_count,
        embedding_length=arch_int("embedding_length"),
        feed_forward_length=arch_int("feed_forward_length"),
        head_count=arch_int("attention.head_count"),
        head_count_kv=arch_int("attention.head_count_kv") or arch_int("attention.head_count"),
        context_length=arch_int("context_length"),
        vocab_size=vocab,
        tokenizer=_str(header, "tokenizer.ggml.model") or "none",
        chat_template=template,
        chat_template_sha256=sha256_text(template) if template is not None else None,
        bos_token_id=_int(header, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_int(header, "tokenizer.ggml.eos_token_id"),
        add_bos=_bool(header, "tokenizer.ggml.add_bos_token", True),
        add_eos=_bool(header, "tokenizer.ggml.add_eos_token", False),
        modules=tuple(sorted(modules)),
        tensors=tuple(sorted((t.name, t.shape) for t in header.tensors.values())),
    )


def _file_type_name(file_type: int | None, types: Counter) -> str:
    from gguf.constants import LlamaFileType

    if file_type is not None:
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    return types.most_common(1)[0][0] if types else "unknown"


def _gguf_adapter(header: gguf_file.GgufHeader) -> AdapterInfo:
    problems: list[str] = []
    adapter_type = _str(header, "adapter.type")
    if adapter_type != "lora":
        problems.append(f"adapter.type is '{printable(str(adapter_type))}', expected 'lora'")
    alpha_raw = header.typed("adapter.lora.alpha", ("float32", "float64"), "a float")
    alpha = float(alpha_raw) if alpha_raw is not None else None
    halves: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {}
    for tensor in header.tensors.values():
        base, _, suffix = tensor.name.rpartition(".")
        if suffix in ("lora_a", "lora_b"):
            halves.setdefault(base, {})[suffix] = (tensor.shape, tensor.type_name)
        else:
            problems.append(f"tensor {printable(tensor.name)} is not a LoRA half "
                            "(expected a .lora_a or .lora_b suffix)")
    # ggml order (ne[0] first): lora_a is (in, rank), lora_b is (rank, out).
    pairs, ranks = _pair_halves(halves, ("lora_a", "lora_b"), (1, 0), problems,
                                ".lora_a/.lora_b")
    base_name = _str(header, "general.base_model.0.name")
    base_sha = _str(header, "adapter.base.sha256")
    return AdapterInfo(
        path=str(header.path),
        format="gguf",
        backend="llama",
        architecture=_str(header, "general.architecture"),
        alpha=alpha,
        rank=ranks[0] if ranks else None,
        pairs=tuple(pairs),
        tensor_count=len(header.tensors),
        dtypes=tuple(sorted({t.type_name for t in header.tensors.values()})),
        base_name=base_name,
        base_sha256=base_sha.lower() if base_sha else None,
        problems=tuple(problems),
    )


def _pair_halves(halves: dict[str, dict[str, tuple[tuple[int, ...], str]]],
                 names: tuple[str, str], rank_axes: tuple[int, int],
                 problems: list[str], label: str) -> tuple[list[LoraPair], list[int]]:
    """Pair each target's A and B halves (shape, dtype): the pairs and their distinct
    ranks. A missing half, a half that is not 2-D, ranks that disagree within a pair or
    across layers, and a file with no halves at all are recorded in `problems`."""
    a_name, b_name = names
    pairs = []
    for target, parts in sorted(halves.items()):
        if a_name not in parts or b_name not in parts:
            missing = b_name if a_name in parts else a_name
            problems.append(f"{printable(target)} has no {missing}")
            continue
        (a_shape, a_type), (b_shape, b_type) = parts[a_name], parts[b_name]
        if len(a_shape) != 2 or len(b_shape) != 2:
            problems.append(f"{printable(target)}: LoRA halves must be 2-D")
            continue
        a_rank, b_rank = a_shape[rank_axes[0]], b_shape[rank_axes[1]]
        if a_rank != b_rank:
            problems.append(f"{printable(target)}: {a_name} rank {a_rank} differs from "
                            f"{b_name} rank {b_rank}")
            continue
        dtype = a_type if a_type == b_type else f"{a_type}/{b_type}"
        pairs.append(LoraPair(target, a_shape, b_shape, dtype, a_rank))
    if not halves:
        problems.insert(0, f"no LoRA tensors ({label}) in the file")
    ranks = sorted({p.rank for p in pairs})
    if len(ranks) > 1:
        # llama.cpp accepts mixed ranks; alpha/rank then scales each layer differently.
        problems.append(f"layers disagree on rank ({ranks}); alpha scaling would be ambiguous")
    return pairs, ranks


# --------------------------------------------------------------------------- PEFT


def _peft_files(path: Path) -> tuple[Path, Path | None]:
    if path.is_dir():
        weights = path / "adapter_model.safetensors"
        if not weights.exists():
            candidates = sorted(path.glob("*.safetensors"))
            if len(candidates) != 1:
                raise InspectionError(f"{path.name}: folder holds no single adapter "
                                      "(expected adapter_model.safetensors)")
            weights = candidates[0]
        config = path / "adapter_config.json"
        return weights, config if config.exists() else None
    config = path.with_name("adapter_config.json")
    return path, config if config.exists() else None


def inspect_peft(path: Path) -> AdapterInfo:
    weights, config_path = _peft_files(path)
    header = safetensors_file.read_header(weights)
    config: dict[str, Any] = {}
    if config_path is not None:
        loaded = read_json_file(config_path, "adapter_config.json")
        if not isinstance(loaded, dict):
            raise InspectionError(f"{config_path.name}: adapter_config.json is not an object")
        config = loaded
    problems: list[str] = []
    halves: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {}
    for tensor in header.tensors.values():
        match = re.fullmatch(r"(.+)\.(lora_A|lora_B)(?:\.default)?\.weight", tensor.name)
        if not match:
            problems.append(f"tensor {printable(tensor.name)} is not a LoRA half "
                            "(expected .lora_A.weight or .lora_B.weight)")
            continue
        module = match.group(1).removeprefix(naming.PEFT_PREFIX)
        halves.setdefault(module, {})[match.group(2)] = (tensor.shape, tensor.dtype)
    # numpy order: lora_A is (rank, in), lora_B is (out, rank).
    pairs, ranks = _pair_halves(halves, ("lora_A", "lora_B"), (0, 1), problems,
                                "lora_A/lora_B")
    r = config.get("r")
    alpha = config.get("lora_alpha")
    if r is not None and (not isinstance(r, int) or isinstance(r, bool)):
        problems.append(f"adapter_config.json: r must be an integer, got {printable(repr(r))}")
        r = None
    if alpha is not None and (not isinstance(alpha, int | float) or isinstance(alpha, bool)):
        problems.append(f"adapter_config.json: lora_alpha must be a number, "
                        f"got {printable(repr(alpha))}")
        alpha = None
    if r is not None and ranks and r != ranks[0]:
        problems.append(f"adapter_config.json says r={r} but the tensors have rank {ranks[0]}")
    meta_alpha = header.metadata.get("lora_alpha")
    if alpha is None and meta_alpha is not None:
        try:
            alpha = float(meta_alpha)
        except ValueError:
            problems.append("metadata lora_alpha is not a number")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        problems.append("adapter_config.json: target_modules must be a list of names")
        targets = []
    base_name = config.get("base_model_name_or_path")
    base_sha = config.get("base_model_sha256") or header.metadata.get("base_sha256")
    return AdapterInfo(
        path=str(weights),
        format="peft",
        backend="openvino",
        architecture=header.metadata.get("architecture"),
        alpha=float(alpha) if alpha is not None else None,
        rank=ranks[0] if ranks else None,
        pairs=tuple(pairs),
        tensor_count=len(header.tensors),
        dtypes=tuple(sorted({t.dtype for t in header.tensors.values()})),
        base_name=str(base_name) if isinstance(base_name, str) else None,
        base_sha256=str(base_sha).lower() if isinstance(base_sha, str) else None,
        problems=tuple(problems),
        config_path=str(config_path) if config_path else None,
        target_modules=tuple(printable(t, 64) for t in targets[:64]),
    )


# --------------------------------------------------------------------------- OpenVINO


def inspect_openvino(folder: Path) -> BaseModelInfo:
    xml = folder / "openvino_model.xml"
    stat_regular(xml)
    stat_regular(folder / "openvino_model.bin")
    for extra in ("openvino_tokenizer.xml", "openvino_detokenizer.xml"):
        if not (folder / extra).exists():
            raise InspectionError(f"{folder.name}: {extra} is missing (export the tokenizer "
                                  "with the model)")
    config: dict[str, Any] = {}
    if (folder / "config.json").exists():
        loaded = read_json_file(folder / "config.json", "config.json")
        config = loaded if isinstance(loaded, dict) else {}
    template = None
    if (folder / "tokenizer_config.json").exists():
        tok = read_json_file(folder / "tokenizer_config.json", "tokenizer_config.json")
        if isinstance(tok, dict) and isinstance(tok.get("chat_template"), str):
            template = tok["chat_template"][:MAX_TEMPLATE_CHARS]
    modules = openvino_matmuls(xml)

    def cfg_int(key: str) -> int:
        value = config.get(key, 0)
        return value if isinstance(value, int) and 0 <= value < 1 << 24 else 0

    archs = config.get("architectures") or ["unknown"]
    model_type = config.get("model_type")
    return BaseModelInfo(
        path=str(folder),
        format="openvino",
        architecture=str(model_type) if isinstance(model_type, str) else "unknown",
        name=printable(str(config.get("_name_or_path") or folder.name)),
        file_type="openvino-ir",
        tensor_types=(),
        block_count=cfg_int("num_hidden_layers"),
        embedding_length=cfg_int("hidden_size"),
        feed_forward_length=cfg_int("intermediate_size"),
        head_count=cfg_int("num_attention_heads"),
        head_count_kv=cfg_int("num_key_value_heads") or cfg_int("num_attention_heads"),
        context_length=cfg_int("max_position_embeddings"),
        vocab_size=cfg_int("vocab_size"),
        tokenizer=printable(str(archs[0] if isinstance(archs, list) and archs else "unknown")),
        chat_template=template,
        chat_template_sha256=sha256_text(template) if template is not None else None,
        bos_token_id=config.get("bos_token_id") if isinstance(config.get("bos_token_id"),
                                                              int) else None,
        eos_token_id=config.get("eos_token_id") if isinstance(config.get("eos_token_id"),
                                                              int) else None,
        add_bos=False,
        add_eos=False,
        modules=tuple(sorted(modules.items())),
    )


_MATMUL_NAME = re.compile(r"^__module\.(model\.layers\.\d{1,5}\.(?:self_attn|mlp)\.[a-z_]+)"
                          r"/aten::linear/MatMul$")


def openvino_matmuls(xml: Path) -> dict[str, tuple[int, int]]:
    """Module path -> (out, in) for every MatMul whose name follows optimum-intel's scheme.

    Only these are candidates: OpenVINO attaches a PEFT tensor to a MatMul whose
    friendly name contains the adapter key, so this map is what coverage is checked
    against. The XML is read by the one bounded scanner (`openvino_ir.scan_matmuls`).
    """
    found: dict[str, tuple[int, int]] = {}
    for layer in openvino_ir.scan_matmuls(xml):
        match = _MATMUL_NAME.match(layer.name)
        if match and layer.out_features is not None and layer.in_features is not None:
            found[match.group(1)] = (layer.out_features, layer.in_features)
    return found


# --------------------------------------------------------------------------- dispatch


def inspect_path(path: Path) -> BaseModelInfo | AdapterInfo:
    """Inspect any supported artifact; raises InspectionError with a clear reason."""
    path = Path(path)
    if path.is_dir():
        if (path / "openvino_model.xml").exists():
            return inspect_openvino(path)
        if (path / "adapter_config.json").exists() or any(path.glob("*.safetensors")):
            return inspect_peft(path)
        raise InspectionError(f"{path}: a directory, expected a model or adapter file "
                              "(or an OpenVINO/PEFT folder)")
    st = stat_regular(path)
    if st.size == 0:
        raise InspectionError(f"{path.name}: empty file")
    handle, _ = open_regular(path)
    with handle:
        head = handle.read(9)
    if head[:4] == gguf_file.MAGIC:
        return inspect_gguf(path)
    # A safetensors file starts with an 8-byte header length, then the JSON header.
    if path.suffix == ".safetensors" or head[8:9] == b"{":
        return inspect_peft(path)
    raise InspectionError(f"{path.name}: not a GGUF or safetensors file (unrecognised content)")
