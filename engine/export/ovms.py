"""The OpenVINO Model Server export: the variant merged (8 bits or better, its survival
checked), built into an OpenVINO IR with our own structural builder, and laid out as an
OVMS model repository with the LLM calculator's graph.

OpenVINO Model Server has no LoRA for text generation (its LLM calculator takes no
adapter), so the variant goes there as one standalone model:

1. merge: `runtime.merge.job.measure` writes the variant's merge (F16 by default, or
   BF16 / Q8_0) in a merge worker process and measures it against the dynamic variant
   on its evaluation set; below `formats.merge.SURVIVAL_THRESHOLD` the export is
   refused (`MergeRefused`) and nothing is written;
2. build: the engine process builds the IR from the merged GGUF
   (`runtime.openvino.build.build_from_gguf`, request `BuildOpenVino`: dequantized to
   F16, converted by OpenVINO GenAI, every projection named by structure, config and
   tokenizer files described from the GGUF). The build is cached by the merged file's
   digest (the merge is deterministic, so exporting again reuses it);
3. lay out: `config.json` (OVMS's `mediapipe_config_list`, one servable named after
   the variant), and in the variant's folder the IR, tokenizer and detokenizer, the
   Hugging Face config files, `graph.pbtxt` (the `HttpLLMCalculator` node, as OVMS's
   own export script writes it) and `chat_template.jinja` (the GGUF's template, which
   OVMS uses instead of the tokenizer's); `request.json` and the README.

The merged GGUF itself is not part of the export (it is a step of the build).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog.store import Catalog
from engine.errors import RefusedError, UsageError
from engine.export.common import (
    Plan,
    Progress,
    chat_example,
    fmt,
    readme_header,
    readme_verify,
    safe_name,
    sampling_fields,
    write_json,
    write_text,
)
from engine.export.target import refuse_other_flags
from engine.formats import capabilities, merge
from engine.runtime.merge import job as merge_job
from engine.runtime.merge import records
from engine.runtime.merge.check import MAX_ITEMS
from engine.runtime.merge.work import MergeWorker

TARGET = "ovms"
CONFIG = "config.json"
GRAPH = "graph.pbtxt"
CHAT_TEMPLATE = "chat_template.jinja"
REQUEST = "request.json"
DEFAULT_MERGE_TYPE = "f16"
# Pinned so OVMS computes as Variant Studio's OpenVINO backend does (f32 activations and
# KV cache over F16 weights, like llama.cpp); this CPU's defaults are bf16 and u8.
PLUGIN_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
CACHE_SIZE_GB = 1
IR_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml",
            "openvino_tokenizer.bin", "openvino_detokenizer.xml", "openvino_detokenizer.bin",
            "config.json", "tokenizer_config.json", "generation_config.json")


@dataclass(frozen=True)
class OvmsOptions:
    """The OVMS export's flags: those of the merge it makes (as for `variant-studio
    merge`)."""

    merge_type: str = DEFAULT_MERGE_TYPE
    eval_rows: int | None = None  # at most this many evaluation items (None: all)
    task_rows: int = merge_job.DEFAULT_TASK_ROWS


class OvmsTarget:
    """The OpenVINO Model Server export as an `engine.export.target.Target`."""

    name = TARGET
    capability = capabilities.EXPORT_OVMS
    options_type = OvmsOptions

    def options_from(self, args: argparse.Namespace) -> OvmsOptions:
        refuse_other_flags(args, TARGET)
        # The merge type is checked in `write`, where callers of the API pass it too.
        task_rows = merge_job.DEFAULT_TASK_ROWS if args.task_rows is None else args.task_rows
        return OvmsOptions(merge_type=args.merge_type or DEFAULT_MERGE_TYPE,
                           eval_rows=args.eval_rows, task_rows=task_rows)

    def write(self, catalog: Catalog, plan: Plan, folder: Path, options: OvmsOptions,
              progress: Progress | None) -> dict[str, Any]:
        return write(catalog, plan, folder, options.merge_type, options.eval_rows,
                     options.task_rows, progress)


target = OvmsTarget()


def write(catalog: Catalog, plan: Plan, folder: Path, merge_type: str = DEFAULT_MERGE_TYPE,
          eval_rows: int | None = None, task_rows: int = merge_job.DEFAULT_TASK_ROWS,
          progress: Progress | None = None,
          cancelled: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Write the OVMS repository into `folder` (a fresh staging folder); returns the
    manifest's target-specific parts: base, adapters, merge and serve."""
    from engine.training import merge_eval

    merge_type = merge.check_type(merge_type)
    if merge_type not in merge.EIGHT_BIT_OR_BETTER:
        raise UsageError(f"--merge-type {merge_type}: the OpenVINO export merges into 8 "
                         f"bits or more ({', '.join(merge.EIGHT_BIT_OR_BETTER)})")
    name = safe_name(plan.variant, "variant name")
    src = records.source(catalog, plan.variant)
    eval_set = merge_eval.eval_set_for(catalog, plan.variant, limit=eval_rows or MAX_ITEMS)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.merge-", dir=folder.parent))
    try:
        merged_gguf = work / f"{name}-{merge_type}.gguf"
        report_stage = _stages(progress)
        with MergeWorker() as worker:
            report = merge_job.measure(src, merged_gguf, merge_type, eval_set, task_rows,
                                       worker, f"{name}-merged", report_stage, cancelled)
        if not report["accepted"]:
            raise merge_job.MergeRefused(report)
        built = _build(merged_gguf, report_stage)
        model_dir = folder / name
        model_dir.mkdir()
        source = Path(built["folder"])
        for file in IR_FILES:
            if not (source / file).is_file():
                raise RefusedError(f"the OpenVINO build has no {file}")
            shutil.copyfile(source / file, model_dir / file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    template = json.loads((model_dir / "tokenizer_config.json").read_text()).get(
        "chat_template")
    if isinstance(template, str) and template:
        write_text(model_dir / CHAT_TEMPLATE, template)
    write_text(model_dir / GRAPH, graph_pbtxt())
    write_json(folder / CONFIG, ovms_config(name))
    write_json(folder / REQUEST, request_example(plan))
    summary = {k: v for k, v in report.items() if k not in ("file", "behaviour")}
    summary["behaviour"] = {k: v for k, v in report["behaviour"].items() if k != "per_item"}
    summary["merged_gguf"] = {k: report["file"][k] for k in ("sha256", "size", "file_type")}
    summary.pop("name", None)
    write_text(folder / "README.md", readme(plan, name, merge_type, summary, built))
    return {
        "base": {"merged": True, "merge_type": merge_type, "folder": name,
                 "merged_gguf_sha256": report["file"]["sha256"],
                 "openvino_version": built.get("openvino_version"),
                 "recipe": built.get("recipe"),
                 "layers_named": built.get("naming", {}).get("renamed")},
        "adapters": [{"folded": True} for _ in plan.adapters],
        "merge": summary,
        "serve": {
            "config": CONFIG, "model": name, "graph": f"{name}/{GRAPH}",
            "command": f"ovms --rest_port 8000 --config_path {CONFIG}",
            "docker": "docker run --rm -p 8000:8000 -v \"$PWD\":/models:ro "
                      "openvino/model_server:latest --rest_port 8000 --config_path "
                      f"/models/{CONFIG}",
            "endpoint": "POST /v3/chat/completions", "request": REQUEST,
            "cwd": "this folder (config.json's base_path is relative to it)",
        },
    }


def _stages(progress: Progress | None) -> Callable[[str, float], None] | None:
    """(stage, fraction) events as the export's one-line stage messages."""
    if progress is None:
        return None
    seen: set[str] = set()

    def report(stage: str, fraction: float) -> None:
        if stage not in seen:
            seen.add(stage)
            progress(stage)

    return report


def _build(gguf: Path, progress: Callable[[str, float], None] | None) -> dict[str, Any]:
    """The structurally named IR of `gguf`, built by the engine process."""
    from engine.runtime import messages
    from engine.runtime.client import run_once

    def on_event(event: messages.Event) -> None:
        if progress is not None and isinstance(event, messages.Progress):
            progress(f"building the OpenVINO IR: {event.stage}", event.fraction)

    return run_once(messages.BuildOpenVino(str(gguf)), on_event)


def graph_pbtxt() -> str:
    """The MediaPipe graph of one LLM servable (OVMS's HttpLLMCalculator), with the IR in
    the graph's own folder."""
    plugin = json.dumps(PLUGIN_CONFIG, sort_keys=True)
    return "\n".join([
        'input_stream: "HTTP_REQUEST_PAYLOAD:input"',
        'output_stream: "HTTP_RESPONSE_PAYLOAD:output"',
        "",
        "node: {",
        '  name: "LLMExecutor"',
        '  calculator: "HttpLLMCalculator"',
        '  input_stream: "LOOPBACK:loopback"',
        '  input_stream: "HTTP_REQUEST_PAYLOAD:input"',
        '  input_side_packet: "LLM_NODE_RESOURCES:llm"',
        '  output_stream: "LOOPBACK:loopback"',
        '  output_stream: "HTTP_RESPONSE_PAYLOAD:output"',
        "  input_stream_info: {",
        "    tag_index: 'LOOPBACK:0',",
        "    back_edge: true",
        "  }",
        "  node_options: {",
        "    [type.googleapis.com / mediapipe.LLMCalculatorOptions]: {",
        '      models_path: "./",',
        f"      plugin_config: '{plugin}',",
        "      enable_prefix_caching: false,",
        f"      cache_size: {CACHE_SIZE_GB},",
        "      max_num_seqs: 256,",
        '      device: "CPU",',
        "    }",
        "  }",
        "  input_stream_handler {",
        '    input_stream_handler: "SyncSetInputStreamHandler",',
        "    options {",
        "      [mediapipe.SyncSetInputStreamHandlerOptions.ext] {",
        "        sync_set {",
        '          tag_index: "LOOPBACK:0"',
        "        }",
        "      }",
        "    }",
        "  }",
        "}",
        "",
    ])


def ovms_config(name: str) -> dict[str, Any]:
    """OVMS's config.json: one MediaPipe servable, its folder relative to this file."""
    return {"mediapipe_config_list": [{"name": name, "base_path": name}],
            "model_config_list": []}


def request_example(plan: Plan) -> dict[str, Any]:
    sampling = sampling_fields(plan)
    return {
        "about": "POST to /v3/chat/completions of the model server. The system prompt is "
                 "part of the variant and no server knows it: send it first in every "
                 "request.",
        "request": {"model": plan.variant, "messages": chat_example(plan),
                    "temperature": sampling["temperature"], "top_p": sampling["top_p"],
                    "top_k": sampling["top_k"], "max_tokens": sampling["max_tokens"],
                    "repetition_penalty": float(plan.profile.get("repeat_penalty", 1.0)),
                    "stream": False},
    }


def readme(plan: Plan, name: str, merge_type: str, summary: dict[str, Any],
           built: dict[str, Any]) -> str:
    weights, behaviour, task = summary["weights"], summary["behaviour"], summary.get("task")
    survival = summary["survival"]
    task_line = ("" if not task else
                 f"- held-out exact match (greedy, first {task['rows']} rows): base "
                 f"{task['base']['strict']:.2f}, variant {task['variant']['strict']:.2f}, "
                 f"merged {task['merged']['strict']:.2f}")
    return "\n".join([
        readme_header(plan, TARGET),
        "## The variant, merged",
        "",
        "OpenVINO Model Server has no LoRA for text generation, so this export is the "
        f"variant **merged**: its adapters folded into the base's weights (`{merge_type}` "
        "merge, scale · alpha / rank · B·A added to each adapted tensor), then built into "
        "an OpenVINO IR. It is a standalone model: there is no adapter to switch off, and "
        "the base is not served alongside it.",
        "",
        "What survived the merge (measured against the variant as Variant Studio serves "
        f"it, on {summary['eval_set']['name']}):",
        "",
        f"- behaviour survival {survival:.3f} (1 - KL(variant‖merged) / KL(variant‖base) "
        f"on next-token distributions: {behaviour['kl_variant_merged']:.5f} / "
        f"{behaviour['kl_variant_base']:.4f} nats per token over {behaviour['positions']} "
        f"tokens); the export is refused below {summary['threshold']:g}",
        f"- weights: the stored change carries {weights['delta_retained']:.1%} of the "
        f"adapters' delta; {weights['rounded_back']:.1%} of the adapted weights kept the "
        "base's value on this grid",
        *([task_line] if task_line else []),
        "",
        "## Files",
        "",
        "| path | what |",
        "| --- | --- |",
        f"| `{CONFIG}` | the model server's configuration: one servable, `{name}` |",
        f"| `{name}/{GRAPH}` | its MediaPipe graph (the `HttpLLMCalculator` node; "
        f"`models_path: \"./\"`) |",
        f"| `{name}/openvino_model.xml`, `.bin` | the merged model as an OpenVINO IR "
        f"({built.get('naming', {}).get('renamed')} projections named by structure) |",
        f"| `{name}/openvino_tokenizer.*`, `openvino_detokenizer.*` | tokenizer and "
        "detokenizer |",
        f"| `{name}/config.json`, `tokenizer_config.json`, `generation_config.json` | the "
        "model's description (from the GGUF's metadata) |",
        f"| `{name}/{CHAT_TEMPLATE}` | the base's chat template (OVMS uses this file) |",
        f"| `{REQUEST}` | an example request |",
        "| `manifest.json` | every file's sha256, the identity, base and adapters, the "
        "merge's figures |",
        "",
        "## Serve it",
        "",
        "From this folder, with Docker:",
        "",
        "```sh",
        "docker run --rm -p 8000:8000 -v \"$PWD\":/models:ro openvino/model_server:latest "
        f"--rest_port 8000 --config_path /models/{CONFIG}",
        "```",
        "",
        f"or with the model server installed: `ovms --rest_port 8000 --config_path {CONFIG}`. "
        f"Requests go to `POST /v3/chat/completions` with `\"model\": \"{name}\"` "
        f"(`{REQUEST}` has one, with the variant's system prompt and sampling).",
        "",
        f"`{GRAPH}` pins `plugin_config` to `{json.dumps(PLUGIN_CONFIG, sort_keys=True)}` so "
        "the server computes as Variant Studio's OpenVINO backend does (f32 activations and "
        "KV cache, like llama.cpp); remove it for the CPU's faster defaults (bf16 compute, "
        f"u8 KV cache), which change the numbers a little. `cache_size` is {CACHE_SIZE_GB} GB "
        "of KV cache; raise it for many parallel requests. Only greedy decoding "
        f"(temperature 0) is comparable across engines; the profile's sampling is "
        f"temperature {fmt(sampling_fields(plan)['temperature'])}.",
        "",
        "## What was checked",
        "",
        "Variant Studio's test suite loads this IR with OpenVINO GenAI "
        "(`openvino_genai.LLMPipeline(folder, \"CPU\")`, the library the model server's LLM "
        "calculator runs on) and checks that it answers held-out requests as the variant "
        "does. The model server itself was not run by the export or its tests.",
        "",
        readme_verify(),
    ])
