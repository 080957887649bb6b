"""The vLLM export: the base in Hugging Face format and the variant as one PEFT adapter,
with the `vllm serve` command that serves both.

The base folder is converted from the variant's own GGUF by `engine.formats.hf_export`
for the file's family (its Hugging Face class and config, every tensor dequantized
exactly to float32, q/k rows put back in Hugging Face order where the family's files
permute them, the tokenizer and chat template from the GGUF's metadata): numpy and the
gguf package only, so exporting needs neither torch nor transformers, and the same GGUF
always gives the same bytes. The adapters are converted for the same description
(`lora_io.gguf_to_peft` with the base's `architecture.Model`).

vLLM applies one LoRA per request at PEFT's `lora_alpha / r` and has no per-request
scale, so the variant's adapters and scales are folded into one PEFT adapter
(`hf_export.fold_adapters`): one adapter keeps its rank and alpha (PEFT's `lora_alpha
/ r` is llama.cpp's `alpha / rank`) with its scale multiplied into B; several are
stacked along the rank with each one's whole multiplier in its B block.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import digest
from engine.catalog.store import Catalog
from engine.errors import RefusedError
from engine.export.common import (
    Plan,
    Progress,
    chat_example,
    fmt,
    quote,
    readme_header,
    readme_verify,
    safe_name,
    sampling_fields,
    write_json,
    write_text,
)
from engine.export.target import refuse_other_flags
from engine.formats import capabilities, gguf_file, hf_export, lora_io, naming
from engine.formats.architecture import Model

TARGET = "vllm"
BASE_DIR = "base"
LORA_DIR = "lora"
SCRIPT = "serve.sh"
REQUEST = "request.json"
# vLLM's accepted --max-lora-rank values (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class VllmOptions:
    """The vLLM export has no flags of its own: the base is always converted into the
    folder, and the adapters always folded into one PEFT adapter."""


class VllmTarget:
    """The vLLM export as an `engine.export.target.Target`."""

    name = TARGET
    capability = capabilities.EXPORT_VLLM
    options_type = VllmOptions

    def options_from(self, args: argparse.Namespace) -> VllmOptions:
        refuse_other_flags(args, TARGET)
        return VllmOptions()

    def write(self, catalog: Catalog, plan: Plan, folder: Path, options: VllmOptions,
              progress: Progress | None) -> dict[str, Any]:
        del catalog, options  # everything is in the plan; there are no options
        return write(plan, folder, progress=progress)


target = VllmTarget()


def write(plan: Plan, folder: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Write the vLLM files into `folder` (a fresh staging folder); returns the
    manifest's target-specific parts: base, adapters, lora and serve."""
    model = hf_export.describe(gguf_file.read_header(Path(plan.base_path)))
    if progress:
        progress(f"converting base {plan.base_name} to Hugging Face format "
                 f"({model.family.hf_class}, float32)")
    hf_export.write_base(plan.base_path, folder / BASE_DIR)
    if digest.sha256_file(plan.base_path) != plan.base_sha256:
        raise RefusedError(f"base {plan.base_name}: the file changed while it was converted")
    if progress:
        progress("folding the adapters into one PEFT adapter")
    parts, adapters = [], []
    for part in plan.adapters:
        weights = lora_io.gguf_to_peft(lora_io.read_gguf(part.path), model)
        parts.append((weights, part.scale))
        adapters.append({"catalog_peft": _compare_catalog_peft(part.peft, weights)})
    folded = hf_export.fold_adapters(parts)
    rank = max_lora_rank(folded.rank)
    lora_rel = f"{LORA_DIR}/{safe_name(plan.variant, 'variant name')}"
    modules = target_modules(folded, plan.n_layer)
    write_peft(folder / lora_rel, folded, plan.base_name, modules)
    argv = serve_command(plan, lora_rel, rank)
    write_text(folder / SCRIPT, serve_script(plan, argv), executable=True)
    write_json(folder / REQUEST, request(plan))
    how = fold_description(plan)
    write_text(folder / "README.md", readme(plan, lora_rel, folded, rank, argv, how, model))
    return {
        "base": {"copied": True, "file": None, "hf_folder": BASE_DIR, "dtype": "float32",
                 "hf_class": model.family.hf_class,
                 "converted_by": "engine.formats.hf_export (exact dequantization, "
                                 + _row_order(model) + ")"},
        "adapters": adapters,
        "lora": {"name": plan.variant, "path": lora_rel, "r": folded.rank,
                 "lora_alpha": folded.alpha,
                 "target_modules": modules, "folded": how},
        "serve": {"script": SCRIPT, "request": REQUEST,
                  "command": " ".join(quote(a) for a in argv),
                  "cwd": "this folder (paths are relative to it)"},
    }


def max_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise RefusedError(f"the variant's LoRA rank {rank} is above vLLM's largest "
                       f"--max-lora-rank ({VLLM_LORA_RANKS[-1]})")


def target_modules(weights: lora_io.LoraWeights, n_layer: int) -> list[str]:
    """PEFT's `target_modules`: the projection names (`q_proj`) when the adapter covers
    that projection in every layer, else the exact module paths. PEFT puts a LoRA on
    every module a name matches and leaves the ones the file lacks at their initial
    values (zero B), so a short name over a partial adapter would only be right by
    PEFT's initialisation; the paths say exactly what is adapted. vLLM reads the
    tensors themselves."""
    by_role: dict[str, set[int]] = {}
    for module in weights.layers:
        by_role.setdefault(module.rsplit(".", 1)[-1], set()).add(
            naming.layer_of(module) if naming.layer_of(module) is not None else -1)
    if all(layers == set(range(n_layer)) for layers in by_role.values()):
        return sorted(by_role)
    return sorted(weights.layers, key=lambda m: (naming.layer_of(m) or 0, m))


def write_peft(folder: Path, weights: lora_io.LoraWeights, base_name: str,
               modules: list[str]) -> None:
    """`adapter_model.safetensors` (float32, canonical PEFT keys) and `adapter_config.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for module, (a, b) in weights.layers.items():
        key = f"{naming.PEFT_PREFIX}{module}"
        tensors[f"{key}.lora_A.weight"] = a
        tensors[f"{key}.lora_B.weight"] = b
    (folder / "adapter_model.safetensors").write_bytes(
        lora_io.safetensors_bytes(tensors, {"format": "pt"}))
    write_json(folder / "adapter_config.json", {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": weights.rank,
        "lora_alpha": weights.alpha, "target_modules": modules,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "modules_to_save": None,
        "inference_mode": True, "base_model_name_or_path": base_name,
    })


def _compare_catalog_peft(record: dict[str, Any] | None,
                          converted: lora_io.LoraWeights) -> dict[str, Any] | None:
    """Does the catalog's own PEFT file (made for OpenVINO) hold the tensors converted
    here from the GGUF? (The export uses the GGUF: it is what llama.cpp serves.)"""
    if record is None:
        return None
    path = Path(record["path"])
    try:
        theirs = lora_io.read_peft(path)
    except (OSError, RefusedError) as exc:
        return {"sha256": record.get("sha256"), "same_tensors": False,
                "detail": str(exc)}
    same = set(theirs.layers) == set(converted.layers) and all(
        np.array_equal(theirs.layers[m][i], converted.layers[m][i])
        for m in converted.layers for i in (0, 1))
    return {"sha256": record.get("sha256"), "same_tensors": bool(same)}


def fold_description(plan: Plan) -> str:
    if len(plan.adapters) == 1:
        part = plan.adapters[0]
        alpha = part.alpha if part.alpha else part.rank
        scale = ("scale 1: B unchanged" if part.scale == 1.0
                 else f"scale {fmt(part.scale)} multiplied into lora_B")
        return (f"one adapter: r={part.rank}, lora_alpha={fmt(alpha)} (PEFT's lora_alpha/r "
                f"= llama.cpp's alpha/rank = {fmt(alpha / part.rank)}); {scale}")
    terms = ", ".join(f"{p.name} x{fmt(p.multiplier)}" for p in plan.adapters)
    rank = sum(p.rank for p in plan.adapters)
    return (f"{len(plan.adapters)} adapters stacked along the rank (r={rank}, "
            f"lora_alpha={rank}, so PEFT's factor is 1); each B block carries its whole "
            f"multiplier scale·alpha/rank: {terms}")


def serve_command(plan: Plan, lora_rel: str, rank: int) -> list[str]:
    argv = ["vllm", "serve", BASE_DIR, "--served-model-name", plan.base_name,
            "--enable-lora", "--lora-modules", f"{plan.variant}={lora_rel}",
            "--max-loras", "1", "--max-lora-rank", str(rank)]
    n_ctx = int(plan.identity["context"]["n_ctx"])
    return argv + ["--max-model-len", str(n_ctx)]


def serve_script(plan: Plan, argv: list[str]) -> str:
    return "\n".join([
        "#!/bin/sh",
        f"# vLLM serving the base {plan.base_name} and the variant {plan.variant} as a LoRA "
        "(a Variant Studio export).",
        "# Extra arguments go to vllm serve (e.g. --dtype float32, --port 8000).",
        "set -eu",
        'cd "$(dirname "$0")"',
        f'exec {" ".join(quote(a) for a in argv)} "$@"',
        "",
    ])


def request(plan: Plan) -> dict[str, Any]:
    sampling = sampling_fields(plan)
    return {
        "endpoint": "POST /v1/chat/completions",
        "request": {"model": plan.variant, "messages": chat_example(plan),
                    "temperature": sampling["temperature"], "top_p": sampling["top_p"],
                    "top_k": sampling["top_k"], "max_tokens": sampling["max_tokens"],
                    "seed": sampling["seed"],
                    "repetition_penalty": float(plan.profile.get("repeat_penalty", 1.0))},
    }


def _row_order(model: Model) -> str:
    if model.family.qk_permuted:
        return "q/k rows put back in Hugging Face order"
    return "rows in the GGUF's order, which is Hugging Face's for this family"


def readme(plan: Plan, lora_rel: str, folded: lora_io.LoraWeights, rank: int,
           argv: list[str], how: str, model: Model) -> str:
    penalty = float(plan.profile.get("repeat_penalty", 1.0))
    penalty_note = [] if penalty == 1.0 else [
        f"The profile's repeat penalty ({fmt(penalty)}) is llama.cpp's (over the last 64 "
        "tokens); vLLM's `repetition_penalty` counts the prompt and every generated "
        "token, so the two differ even at the same value.", ""]
    return "\n".join([
        readme_header(plan, "vLLM"),
        "## Files",
        "",
        "| path | what |",
        "| --- | --- |",
        f"| `{BASE_DIR}/` | the base `{plan.base_name}` in Hugging Face format: "
        "`config.json`, `generation_config.json`, `model.safetensors` (float32), "
        "`tokenizer.json`, `tokenizer_config.json` (with the chat template) |",
        f"| `{lora_rel}/` | the variant as one PEFT LoRA adapter (`adapter_config.json`, "
        "`adapter_model.safetensors`) |",
        f"| `{SCRIPT}` | the `vllm serve` command below, run from this folder |",
        f"| `{REQUEST}` | an example chat request for the variant |",
        "| `manifest.json` | every file's sha256, the identity, base and adapters |",
        "",
        "## Serve it",
        "",
        "```sh",
        " ".join(quote(a) for a in argv),
        "```",
        "",
        f"from this folder (`./{SCRIPT}` does exactly that; extra arguments are passed on). "
        f"Requests with `\"model\": \"{plan.variant}\"` get the variant, `\"model\": "
        f"\"{plan.base_name}\"` the plain base. `--max-lora-rank {rank}` is the smallest "
        f"value vLLM accepts for this adapter's rank ({folded.rank}). To serve several "
        "exported variants over one base, give each a `--lora-modules NAME=PATH` and raise "
        "`--max-loras` to how many may run in one batch.",
        "",
        "## How the base was made",
        "",
        f"The base is converted from the variant's GGUF (sha256 above) into "
        f"`{model.family.hf_class}`, not taken from elsewhere: every tensor is dequantized "
        "exactly to float32 (the GGUF's quantized blocks hold f16 scales, which float32 "
        f"represents exactly), {_row_order(model)}. `config.json` says what llama.cpp "
        "computes from this file (head size, RoPE, norms, soft-caps and sliding windows "
        "where the family has them). The tokenizer (byte-level BPE) and chat template "
        "come from the GGUF's metadata.",
        "",
        "vLLM downcasts float32 checkpoints to 16 bits by default (`--dtype auto`); add "
        "`--dtype float32` to serve the values that were checked (next section).",
        "",
        "## How the adapters were folded",
        "",
        "vLLM applies one LoRA per request, scaled by PEFT's `lora_alpha / r`, and has no "
        "per-request scale; llama.cpp multiplies each adapter's B·A by scale · alpha / "
        f"rank. So the variant is one PEFT adapter ({how}). The rows of each B are in "
        f"Hugging Face order ({_row_order(model)}).",
        "",
        *penalty_note,
        "## What was checked",
        "",
        "Variant Studio's test suite runs this export (the same code) for its demo variant "
        "and for a two-adapter variant at other scales, loads the base and adapter with "
        "`transformers` and `peft` (what vLLM reads) in float32, and compares next-token "
        "distributions, teacher-forced on the same token ids, with the variant served by "
        "llama.cpp from its GGUF files, for the base alone and for the variant "
        "(docs/serving.md in Variant Studio gives the measured KL divergence and top-1 "
        "agreement). They are close, not equal: llama.cpp multiplies its 4-bit weights with "
        "8-bit activations. This particular folder was not compared, and vLLM itself was "
        "not run.",
        "",
        readme_verify(),
    ])
