"""The llama-server export: the variant's adapter GGUFs, a `--models-preset` INI for
llama-server's router mode, the same variant as one command line, and the per-request
LoRA ids for serving several variants over one base.

The adapter files are byte-for-byte the ones Variant Studio serves (copied from the
catalog's store and re-hashed). Scales are given to llama-server as they are:
llama.cpp itself multiplies B·A by `scale · alpha / rank` (the GGUF's
`adapter.lora.alpha`), so nothing here pre-multiplies.

The base GGUF is referenced by path and sha256 unless `copy_base`: bases are the large
part of a variant (often gigabytes), one base serves many variants, and a serving team
usually has it already; the digest pins the exact file. A team without it re-exports
with `--copy-base`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog.store import Catalog
from engine.errors import RefusedError
from engine.export.common import (
    LLAMA_CPP_ISSUE,
    Plan,
    Progress,
    chat_example,
    copy_file,
    file_sha256,
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
from engine.formats import capabilities

TARGET = "llama-server"
PRESET = "models.ini"
SCRIPT = "serve.sh"
LORA_REQUEST = "lora-request.json"


@dataclass(frozen=True)
class LlamaServerOptions:
    """The llama-server export's flags."""

    copy_base: bool = False  # copy the base GGUF into the folder (default: reference it)


class LlamaServerTarget:
    """The llama-server export as an `engine.export.target.Target`."""

    name = TARGET
    capability = capabilities.EXPORT_LLAMA_SERVER
    options_type = LlamaServerOptions

    def options_from(self, args: argparse.Namespace) -> LlamaServerOptions:
        refuse_other_flags(args, TARGET)
        return LlamaServerOptions(copy_base=bool(args.copy_base))

    def write(self, catalog: Catalog, plan: Plan, folder: Path, options: LlamaServerOptions,
              progress: Progress | None) -> dict[str, Any]:
        del catalog  # everything is in the plan
        return write(plan, folder, copy_base=options.copy_base, progress=progress)


target = LlamaServerTarget()


def write(plan: Plan, folder: Path, copy_base: bool = False,
          progress: Progress | None = None) -> dict[str, Any]:
    """Write the llama-server files into `folder` (a fresh staging folder); returns the
    manifest's target-specific parts: base, adapters and serve."""
    adapters = []
    for index, part in enumerate(plan.adapters):
        if progress:
            progress(f"copying adapter {part.name}")
        relative = f"adapters/{safe_name(part.name, 'adapter name')}.gguf"
        _copy_verified(part.path, folder / relative, part.sha256, f"adapter {part.name}")
        adapters.append({"id": index, "file": relative})
    base_file = None
    if copy_base:
        if progress:
            progress(f"copying base {plan.base_name}")
        base_file = f"base/{safe_name(plan.base_name, 'model name')}.gguf"
        _copy_verified(plan.base_path, folder / base_file, plan.base_sha256,
                       f"base {plan.base_name}")
    base_arg = base_file or str(plan.base_path)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in base_arg):
        # An INI value ends at the line: a control character would add lines to it.
        raise RefusedError(f"the path of base {plan.base_name} holds a control character; "
                           "export with --copy-base")
    lora_files = [a["file"] for a in adapters]
    single = single_command(plan, base_arg, lora_files)
    shared = shared_base_command(base_arg, lora_files)
    write_text(folder / PRESET, models_preset(plan, base_arg, lora_files))
    write_text(folder / SCRIPT, serve_script(plan, base_file, lora_files), executable=True)
    write_json(folder / LORA_REQUEST, lora_request(plan, shared, lora_files))
    write_text(folder / "README.md", readme(plan, base_file, lora_files, single, shared))
    return {
        "base": {"copied": base_file is not None, "file": base_file,
                 "path": None if base_file else str(plan.base_path)},
        "adapters": adapters,
        "serve": {
            "preset": PRESET, "script": SCRIPT, "lora_request": LORA_REQUEST,
            "router_command": f"llama-server --models-preset {PRESET}",
            "command": " ".join(quote(a) for a in single),
            "shared_base_command": " ".join(quote(a) for a in shared),
            "cwd": "this folder (paths are relative to the server's working directory)",
        },
    }


def _copy_verified(source: Path, target: Path, sha256: str, what: str) -> None:
    copy_file(source, target)
    if file_sha256(target) != sha256:  # changed between the check and the copy
        raise RefusedError(f"{what}: the file changed while it was copied")


def _lora_scaled(plan: Plan, lora_files: list[str]) -> str:
    return ",".join(f"{path}:{fmt(part.scale)}"
                    for path, part in zip(lora_files, plan.adapters, strict=True))


def _sampling_flags(plan: Plan) -> list[tuple[str, str]]:
    sampling = sampling_fields(plan)
    return [("temp", fmt(sampling["temperature"])), ("top-k", str(sampling["top_k"])),
            ("top-p", fmt(sampling["top_p"])),
            ("repeat-penalty", fmt(plan.profile.get("repeat_penalty", 1.0))),
            ("n-predict", str(sampling["max_tokens"]))]


def single_command(plan: Plan, base: str, lora_files: list[str]) -> list[str]:
    """One llama-server serving this variant: the base, its adapters at their scales,
    its context and the profile's sampling as the server's defaults."""
    argv = ["llama-server", "--model", base, "--lora-scaled", _lora_scaled(plan, lora_files),
            "--alias", plan.variant, "--ctx-size", str(plan.identity["context"]["n_ctx"])]
    for flag, value in _sampling_flags(plan):
        argv += [f"--{flag}", value]
    return argv


def shared_base_command(base: str, lora_files: list[str]) -> list[str]:
    """One llama-server over the base with the adapters loaded but not applied, for
    per-request LoRA (ids are positions in the --lora list)."""
    return ["llama-server", "--model", base, "--lora", ",".join(lora_files),
            "--lora-init-without-apply"]


def models_preset(plan: Plan, base: str, lora_files: list[str]) -> str:
    """The router-mode preset: one section named after the variant (the `model` of a
    request); keys are llama-server's command-line flags without the dashes."""
    lines = [
        f"; Variant Studio export of {plan.variant} (identity {plan.identity['key']}).",
        f"; Router mode: cd into this folder, then: llama-server --models-preset {PRESET}",
        "; Keys are llama-server flags without the dashes. Paths are relative to the",
        "; server's working directory (this folder); the base may be an absolute path.",
        "; lora-scaled takes each adapter's own scale: llama.cpp applies alpha/rank itself.",
        "version = 1",
        "",
        f"[{plan.variant}]",
        f"model = {base}",
        f"lora-scaled = {_lora_scaled(plan, lora_files)}",
        f"ctx-size = {plan.identity['context']['n_ctx']}",
    ]
    lines += [f"{flag} = {value}" for flag, value in _sampling_flags(plan)]
    return "\n".join(lines) + "\n"


def serve_script(plan: Plan, base_file: str | None, lora_files: list[str]) -> str:
    base = base_file or str(plan.base_path)
    argv = single_command(plan, "BASE", lora_files)
    command = " ".join('"$base"' if a == "BASE" else quote(a) for a in argv)
    return "\n".join([
        "#!/bin/sh",
        f"# llama-server serving the variant {plan.variant} (a Variant Studio export).",
        f"# The base must be the GGUF with sha256 {plan.base_sha256};",
        "# BASE_GGUF=/path/to/it overrides where it is. Extra arguments go to llama-server.",
        "set -eu",
        'cd "$(dirname "$0")"',
        'base="${BASE_GGUF:-}"',
        f'[ -n "$base" ] || base={quote(base)}',
        f'exec {command} "$@"',
        "",
    ])


def lora_request(plan: Plan, shared: list[str], lora_files: list[str]) -> dict[str, Any]:
    sampling = sampling_fields(plan)
    body: dict[str, Any] = {
        "messages": chat_example(plan),
        "lora": [{"id": i, "scale": part.scale} for i, part in enumerate(plan.adapters)],
        # llama.cpp issue 26207: the prompt cache is reused across requests whose
        # per-request lora differs; not caching the prompt avoids it.
        "cache_prompt": False,
        "temperature": sampling["temperature"], "top_p": sampling["top_p"],
        "top_k": sampling["top_k"], "max_tokens": sampling["max_tokens"],
        "seed": sampling["seed"],
        "repeat_penalty": float(plan.profile.get("repeat_penalty", 1.0)),
    }
    return {
        "about": "One llama-server over the base with every adapter loaded but not applied "
                 "(server_command); each request chooses adapters and scales by id: ids are "
                 "positions in the --lora list, adapters a request leaves out get scale 0. "
                 "Scales are the variant's own: llama.cpp multiplies by alpha/rank itself.",
        "server_command": " ".join(quote(a) for a in shared),
        "adapters": [{"id": i, "name": part.name, "file": path, "sha256": part.sha256}
                     for i, (path, part) in enumerate(zip(lora_files, plan.adapters,
                                                          strict=True))],
        "endpoint": "POST /v1/chat/completions",
        "request": body,
        "known_issue": f"{LLAMA_CPP_ISSUE}: keep \"cache_prompt\": false in every request "
                       "while requests with different lora share the server",
    }


def readme(plan: Plan, base_file: str | None, lora_files: list[str], single: list[str],
           shared: list[str]) -> str:
    n_ctx = plan.identity["context"]["n_ctx"]
    files = [f"| `{path}` | adapter {i} `{part.name}` (byte-identical to the catalog's "
             f"stored GGUF) |"
             for i, (path, part) in enumerate(zip(lora_files, plan.adapters, strict=True))]
    if base_file:
        files.append(f"| `{base_file}` | the base model `{plan.base_name}` |")
    files += [
        f"| `{PRESET}` | a `--models-preset` file for llama-server's router mode |",
        f"| `{SCRIPT}` | the same variant as one `llama-server` command |",
        f"| `{LORA_REQUEST}` | per-request LoRA: the ids, a server command and a request |",
        "| `manifest.json` | every file's sha256, the identity, base and adapters |",
    ]
    if base_file:
        base_text = [
            f"The base GGUF is in this folder (`{base_file}`, copied with `--copy-base`).",
        ]
    else:
        base_text = [
            "The base GGUF is **referenced, not copied**: bases are the large part of a "
            "variant (often gigabytes), one base serves many variants, and a serving team "
            "usually has it already. Use your copy of the file with sha256 "
            f"`{plan.base_sha256}`"
            + (f" ({plan.base_source})" if plan.base_source else "")
            + f"; on the exporting machine it was `{plan.base_path}`. Point `model =` in "
            f"`{PRESET}` at it, or run `BASE_GGUF=/path/to/it ./{SCRIPT}`. To ship it in "
            "this folder instead, export again with `--copy-base`.",
        ]
    lora_json = ", ".join(f'{{"id": {i}, "scale": {fmt(p.scale)}}}'
                          for i, p in enumerate(plan.adapters))
    return "\n".join([
        readme_header(plan, TARGET),
        "## Files",
        "",
        "| path | what |",
        "| --- | --- |",
        *files,
        "",
        "## The base model",
        "",
        *base_text,
        "",
        "## Serve it with router mode",
        "",
        "Paths in the preset are relative to llama-server's working directory, so start it "
        "from this folder:",
        "",
        "```sh",
        f"cd /path/to/this/folder && llama-server --models-preset {PRESET}",
        "```",
        "",
        f"Requests name the variant: `\"model\": \"{plan.variant}\"`. The preset sets the "
        f"base, `lora-scaled` (each adapter's own scale), the context ({n_ctx}) and the "
        "profile's sampling as that model's defaults; each model runs in its own process "
        "with a fixed adapter set, so requests for different variants never share a "
        "prompt cache.",
        "",
        "## Serve it with one command",
        "",
        "```sh",
        " ".join(quote(a) for a in single),
        "```",
        "",
        f"(`./{SCRIPT}` runs exactly this from this folder.) `--lora-scaled FILE:SCALE` takes "
        "the variant's scale as it is: llama.cpp multiplies B·A by scale · alpha / rank "
        "itself (alpha from the GGUF's `adapter.lora.alpha`), so do not pre-multiply. "
        f"`--ctx-size` is the whole KV cache, shared by the server's parallel slots; give "
        f"{n_ctx} per slot if requests need the variant's full context.",
        "",
        "## Several variants over one base",
        "",
        "One server can hold the base once with every adapter loaded but not applied; each "
        "request then picks adapters and scales by id (the position in the `--lora` list; "
        "adapters a request leaves out get scale 0):",
        "",
        "```sh",
        " ".join(quote(a) for a in shared),
        "```",
        "",
        f"and in each request to `/v1/chat/completions` or `/completion`: "
        f"`\"lora\": [{lora_json}]` with `\"cache_prompt\": false`. `{LORA_REQUEST}` holds "
        "the ids, the command and a whole request. To serve several exported variants this "
        "way, list all their adapter files in one `--lora` and renumber the ids.",
        "",
        f"**Known llama.cpp bug ([issue 26207]({LLAMA_CPP_ISSUE})):** the prompt cache is "
        "reused across requests whose per-request `lora` differs, so a request can be "
        "answered from KV state computed under another adapter set. Until it is fixed, send "
        "`\"cache_prompt\": false` in every request on a shared server (llama-server's "
        "`--no-cache-prompt` flag makes that the default). Router mode (above) does not "
        "have the problem: one variant per process.",
        "",
        "## What was checked",
        "",
        "The adapter files are the bytes Variant Studio serves (sha256 above and in "
        "`manifest.json`); for its demo variant, its test suite loads the exported adapter "
        "as a LoRA for the base in llama.cpp (through llama-cpp-python) and checks the "
        "preset and command files. "
        "llama-server itself was not run by the export or its tests.",
        "",
        readme_verify(),
    ])
