"""The commands that run a model: generate, compare and parity (one engine process each)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.catalog import entries
from engine.catalog.store import Catalog
from engine.cli.output import emit_json
from engine.errors import UsageError
from engine.runtime import assembly, messages
from engine.runtime.client import run_once
from engine.runtime.results import CompareResult, CrossCheckResult, GenerationResult


def request(kind: type[messages.Generate], catalog: Catalog, args: argparse.Namespace
            ) -> messages.Generate:
    """The Generate or Compare request the flags describe (`runtime.assembly`: the
    variant's profile, with the sampling flags on top)."""
    prompt = messages.Prompt(args.prompt, chat=bool(args.chat),
                             system=getattr(args, "system", None))
    return assembly.request(catalog, args.name, prompt, kind=kind,
                            backend=getattr(args, "backend", None),
                            ov_profile=getattr(args, "profile", None),
                            max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed, top_p=getattr(args, "top_p", None),
                            top_k=getattr(args, "top_k", None))


# What `generate --json` and `compare --json` print of each answer.
JSON_FIELDS = ("text", "token_ids", "identity", "tokens_per_second", "logprobs",
               "finish_reason", "name", "backend", "prompt_tokens")


def _fields(result: GenerationResult) -> dict[str, Any]:
    answer = result.to_dict()
    return {k: answer[k] for k in JSON_FIELDS}


def cmd_generate(catalog: Catalog, args: argparse.Namespace) -> int:
    def stream(event: messages.Event) -> None:
        if isinstance(event, messages.Token):
            sys.stdout.write(event.text)
            sys.stdout.flush()

    result: GenerationResult = run_once(request(messages.Generate, catalog, args),
                                        None if args.json else stream)
    if args.json:
        # `replay` is what `variant-studio replay` regenerates the answer from.
        emit_json({**_fields(result), "replay": result.replay})
    else:
        sys.stdout.write("\n")
        print(f"[{result.name} · {result.backend} · {result.identity[:12]} · "
              f"{result.tokens_per_second:.1f} tok/s · {result.finish_reason}]",
              file=sys.stderr)
    return 0


def cmd_compare(catalog: Catalog, args: argparse.Namespace) -> int:
    result: CompareResult = run_once(request(messages.Compare, catalog, args))
    if args.json:
        emit_json({"base": _fields(result.base), "variant": _fields(result.variant),
                   "first_divergence": result.first_divergence,
                   "adapter_effect": result.adapter_effect})
        return 0
    for side in ("base", "variant"):
        r = result.side(side)
        print(f"== {side}: {r.name} on {r.backend} [{r.identity[:12]}] "
              f"{r.tokens_per_second:.1f} tok/s")
        print(r.text)
    div = result.first_divergence
    print(f"== first divergence: {'none' if div is None else f'token {div}'}; "
          f"adapter effect: {result.adapter_effect:.4f} nats/token "
          "(mean |Δ log p| of the base's tokens under the variant)")
    return 0


PARITY_PROMPTS = (
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "Give me three tips for learning to cook.",
    "Explain what a neural network is in one sentence.",
)


def cmd_parity(catalog: Catalog, args: argparse.Namespace) -> int:
    if not 1 <= args.tokens <= 256:
        raise UsageError("--tokens must be 1..256")
    prompts = tuple(messages.Prompt(p, chat=True) for p in (args.prompt or PARITY_PROMPTS))
    # Parity is what the exact profile is for (the same F16 weights, at f32).
    check = assembly.cross_check(catalog, args.name, prompts, args.tokens, bool(args.genai),
                                 getattr(args, "profile", None))
    second = check.second
    result: CrossCheckResult = run_once(check)
    # The adapters' own `show` reports keep what this run found (OpenVINO's warnings
    # included), so they are not lost once this output scrolls away.
    recorded = catalog.record_cross_check(
        [(a.name, a.sha256) for a in second.adapters], "openvino",
        entries.cross_check_summary(args.name, result))
    if args.json:
        emit_json({**result.to_dict(), "recorded_for": recorded})
        return 0
    a, b = result.first, result.second
    print(f"{a.name}: {a.backend} [{a.identity[:12]}] vs {b.backend} "
          f"[{b.identity[:12]}], {len(result.prompts)} prompts, {args.tokens} tokens")
    for row in result.prompts:
        print(f"  prompt of {row.prompt_tokens} tokens: {row.agreeing_tokens} greedy "
              f"tokens agree; KL max {row.max_kl:.4f} mean {row.mean_kl:.4f} nats; "
              f"top-1 {row.top1_agreement:.2f}")
    print(f"overall: KL max {result.max_kl:.4f}, mean {result.mean_kl:.4f} nats; "
          f"top-1 agreement {result.top1_agreement:.2f}; first tokens agree on "
          f"{result.first_token_agreement:.0%} of prompts")
    if result.genai is not None:
        print(f"OpenVINO GenAI ({result.genai.mode}): greedy tokens agreeing with ours "
              f"{list(result.genai.agreeing_tokens)}")
    warnings, unused = result.openvino_warnings, result.unused_lora_tensors
    print(f"OpenVINO warnings on stderr: {len(warnings) or 'none'}; unused LoRA tensors: "
          f"{len(unused) or 'none'}")
    limit = 20  # the JSON has every line
    for line in warnings[:limit]:
        print(f"  stderr: {line}")
    if len(warnings) > limit:
        print(f"  … {len(warnings) - limit} more lines (--json lists them all)")
    return 0
