"""What every export target shares: the variant resolved into verified parts (`Plan`),
file helpers, and the README sections both targets carry.

A plan is made from the catalog once, before anything is written: the base and every
adapter file are re-hashed and must match their records, so an export describes the
bytes the variant is served from, and a changed file is refused with nothing written.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import __version__
from engine.catalog import digest, resolve
from engine.catalog.store import Catalog
from engine.errors import RefusedError, UsageError
from engine.formats import artifacts, lora_io, naming
from engine.formats.tool_calls import FORMAT_LABELS
from engine.state import paths

Progress = Callable[[str], None]
MANIFEST = "manifest.json"
README = "README.md"
MANIFEST_FORMAT = "variant-studio-export"
MANIFEST_VERSION = 1
LLAMA_CPP_ISSUE = "https://github.com/ggml-org/llama.cpp/issues/26207"


@dataclass(frozen=True)
class AdapterPart:
    """One adapter of the variant, as llama.cpp serves it (its GGUF file)."""

    name: str
    path: Path  # the catalog's stored GGUF (verified against `sha256`)
    sha256: str
    scale: float
    rank: int
    alpha: float
    targets: tuple[str, ...]
    peft: dict[str, Any] | None  # the catalog's OpenVINO (PEFT) file record, if any

    @property
    def multiplier(self) -> float:
        """What llama.cpp multiplies B·A by: scale · alpha / rank (alpha 0: scale)."""
        return lora_io.multiplier(self.scale, self.alpha, self.rank)


@dataclass(frozen=True)
class Plan:
    """A variant resolved for export, every file verified."""

    variant: str
    identity: dict[str, Any]  # the llama.cpp identity, with its key
    profile: dict[str, Any]
    base_name: str
    base_path: Path
    base_sha256: str
    base_source: str | None
    head_count: int
    head_count_kv: int
    n_layer: int
    adapters: tuple[AdapterPart, ...]

    @property
    def identity_short(self) -> str:
        return str(self.identity["key"])[:12]


def make_plan(catalog: Catalog, name: str) -> Plan:
    """Resolve variant `name` on llama.cpp and verify its files (nothing is written)."""
    kind, record = catalog.find(name)
    if kind != "variant":
        raise UsageError(f"{name!r} is a {kind}: export takes a variant (a base model has "
                         "nothing to export but its own file)")
    spec = resolve.resolve(catalog, name, backend="llama")
    base = catalog.model(spec.base_name)
    status = catalog.verify_base(spec.base_name)
    if not status.ok:
        raise RefusedError(f"base {spec.base_name}: {status.detail}")
    meta = base.get("metadata", {})
    parts = []
    for adapter in spec.adapters:
        digest.require_unchanged(adapter.name, Path(adapter.path), adapter.sha256)
        info = artifacts.inspect_path(Path(adapter.path))
        if not isinstance(info, artifacts.AdapterInfo) or info.format != "gguf":
            raise RefusedError(f"adapter {adapter.name}: its llama.cpp file is not a GGUF LoRA")
        if info.problems:
            raise RefusedError(f"adapter {adapter.name}: {info.problems[0]}")
        record_full = catalog.adapter(adapter.name)
        peft = None
        if record_full.get("backend") == "openvino":
            peft = record_full
        elif "openvino" in record_full.get("files", {}):
            peft = record_full["files"]["openvino"]
        roles = sorted({role for p in info.pairs if (role := naming.role_of(p.target))})
        parts.append(AdapterPart(adapter.name, Path(adapter.path), adapter.sha256,
                                 float(adapter.scale), int(info.rank or 0),
                                 float(info.alpha or 0.0), tuple(roles), peft))
    return Plan(
        variant=name, identity=spec.identity.to_dict(), profile=resolve.profile(catalog, name),
        base_name=spec.base_name, base_path=Path(spec.base_path), base_sha256=base["sha256"],
        base_source=base.get("source"), head_count=int(meta["head_count"]),
        head_count_kv=int(meta.get("head_count_kv") or meta["head_count"]),
        n_layer=int(meta["block_count"]),
        adapters=tuple(parts))


# ------------------------------------------------------------------------------ files


def safe_name(name: str, what: str) -> str:
    """A catalog name used as a file name: catalog names are already restricted to
    letters, digits, '.', '_' and '-' (checked again here; nothing else becomes a path)."""
    return paths.check_name(name, what)


def copy_file(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def file_sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def write_text(path: Path, text: str, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if executable:
        path.chmod(0o755)


def write_json(path: Path, value: Any) -> None:
    write_text(path, json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def quote(text: str | Path) -> str:
    return shlex.quote(str(text))


def fmt(value: float) -> str:
    """A number as commands and INI files take it (`1`, `0.5`, `1e-05`)."""
    return f"{float(value):g}"


# ----------------------------------------------------------------------------- sampling


def chat_example(plan: Plan, user: str = "What will the weather be in Lisbon tomorrow?"
                 ) -> list[dict[str, str]]:
    """The messages of an example request: the variant's system prompt first (no
    server knows it; every request must carry it)."""
    messages = []
    if plan.profile.get("system_prompt"):
        messages.append({"role": "system", "content": str(plan.profile["system_prompt"])})
    messages.append({"role": "user", "content": user})
    return messages


def sampling_fields(plan: Plan) -> dict[str, Any]:
    """The variant's profile as OpenAI-style request fields (llama-server and vLLM both
    take top_k; the repetition penalty is named per engine by the caller)."""
    profile = plan.profile
    return {"temperature": float(profile.get("temperature", 0.7)),
            "top_p": float(profile.get("top_p", 1.0)), "top_k": int(profile.get("top_k", 0)),
            "max_tokens": int(profile.get("max_tokens", 256)), "seed": int(profile.get("seed", 0))}


# ------------------------------------------------------------------------------ readme


def readme_header(plan: Plan, target: str) -> str:
    identity = plan.identity
    lines = [
        f"# {plan.variant} — exported for {target}",
        "",
        f"Written by Variant Studio {__version__} (`variant-studio export {plan.variant} "
        f"--target {target}`). A *variant* is a base model plus LoRA adapters at fixed "
        "scales plus a runtime profile; this folder holds what you need to serve the same "
        f"variant with {target}. `manifest.json` lists every file here with its sha256, the "
        "variant's identity, its base and its adapters.",
        "",
        "## The variant",
        "",
        f"- identity (as Variant Studio serves it on llama.cpp): `{identity['key']}`",
        f"- base: `{plan.base_name}`, GGUF sha256 `{plan.base_sha256}`"
        + (f" (from {plan.base_source})" if plan.base_source else ""),
    ]
    for i, part in enumerate(plan.adapters):
        lines.append(f"- adapter {i}: `{part.name}`, GGUF sha256 `{part.sha256}`, rank "
                     f"{part.rank}, alpha {fmt(part.alpha)}, targets {', '.join(part.targets)}, "
                     f"scale {fmt(part.scale)} (B·A is multiplied by scale · alpha / rank = "
                     f"{fmt(part.multiplier)})")
    sampling = sampling_fields(plan)
    lines += [
        f"- context: {identity['context']['n_ctx']} tokens",
        f"- sampling (the profile): temperature {fmt(sampling['temperature'])}, top_p "
        f"{fmt(sampling['top_p'])}, top_k {sampling['top_k']}, repeat penalty "
        f"{fmt(plan.profile.get('repeat_penalty', 1.0))}, max_tokens {sampling['max_tokens']}",
        "",
    ]
    system = plan.profile.get("system_prompt")
    if system:
        lines += [
            "The variant's **system prompt** is part of it, and no server knows it: send it "
            "as the first message of every chat request (the examples below do):",
            "",
            "```text",
            str(system),
            "```",
            "",
        ]
    if plan.profile.get("tool_format"):
        lines += [
            f"The variant writes **tool calls** in a format its profile declares "
            f"(`{plan.profile['tool_format']}`: "
            f"{FORMAT_LABELS[plan.profile['tool_format']]}), not in the one "
            "its base's chat template names. This server parses calls by the template, so "
            "it returns them as text: read them from the answer's content yourself.",
            "",
        ]
    lines += [
        "The chat template is the base model's own (the GGUF's `tokenizer.chat_template`). "
        "Only greedy decoding (temperature 0) is comparable across engines: each engine "
        "has its own sampler and random numbers.",
        "",
    ]
    return "\n".join(lines)


def readme_verify() -> str:
    return "\n".join([
        "## Check the files",
        "",
        "Every file is listed in `manifest.json` (`files`: path, sha256, size). From this "
        "folder:",
        "",
        "```sh",
        "python3 -c 'import hashlib, json; m = json.load(open(\"manifest.json\")); "
        "bad = [f[\"path\"] for f in m[\"files\"] if hashlib.sha256(open(f[\"path\"], "
        "\"rb\").read()).hexdigest() != f[\"sha256\"]]; print(bad or \"all files match\")'",
        "```",
        "",
        "Re-running the same `variant-studio export` into this folder replaces it (only a "
        "folder that holds nothing but a previous export of the same variant is "
        "replaced; anything else is refused).",
        "",
    ])
