"""The train and train-rl commands: a LoRA adapter trained in its own worker process."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from engine.catalog.store import Catalog
from engine.cli.output import emit_json
from engine.errors import RefusedError, UsageError
from engine.training import memory


def cmd_train(catalog: Catalog, args: argparse.Namespace) -> int:
    from engine.training import ENABLE_HINT, torch_available
    from engine.training.job import TrainRequest, prepare

    if not torch_available():
        raise RefusedError(ENABLE_HINT)
    if args.dpo_beta is not None and not args.dpo:
        raise UsageError("--dpo-beta is the preference-training strength: add --dpo "
                         "(supervised training has no beta)")
    settings: dict[str, Any] = {}
    for key in ("steps", "rank", "alpha", "lr", "targets", "seq_len", "batch", "seed",
                "save_every", "dpo_beta", "threads", "numerics", "kl", "kl_batch"):
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    for flag in ("train_eot", "dpo"):
        if getattr(args, flag):
            settings[flag] = True
    request = TrainRequest(name=args.name, base=args.base, data=str(args.data),
                           settings=settings, init_adapter=args.init_adapter,
                           resume=str(args.resume) if args.resume else None,
                           variant=args.variant,
                           kl_text=str(args.kl_text) if args.kl_text else None)
    prepared = prepare(catalog, request)  # refuse a bad request before starting anything
    quiet = bool(args.json)

    def on_event(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "warning":
            print(f"warning: {event['message']}", file=sys.stderr)
        elif kind == "stopped":  # with --json too: the only way to learn the checkpoint
            if event.get("checkpoint"):
                print(f"stopped at step {event['step']}; resume with --resume "
                      f"{event['checkpoint']}", file=sys.stderr)
        elif quiet:
            return
        elif kind == "stage":
            print(f"{event['stage']}…", file=sys.stderr)
        elif kind == "data":
            print(f"data: {event['examples']} examples, {event['target_tokens']} target "
                  f"tokens ({', '.join(event['kinds'])}), sha256 {event['sha256'][:16]}…",
                  file=sys.stderr)
        elif kind == "resumed":
            print(f"resumed at step {event['step']}/{event['steps']}", file=sys.stderr)
        elif kind == "memory":
            print(f"memory: {memory.summary(event)}", file=sys.stderr)
        elif kind == "progress":
            extra = (f" reward-acc {event['reward_accuracy']:.2f}"
                     if "reward_accuracy" in event else "")
            print(f"step {event['step']}/{event['steps']} loss {event['loss']:.4f} "
                  f"lr {event['lr']:.2e}{extra} ({event['step_seconds']:.1f} s/step, "
                  f"{event['seconds']:.0f} s, eta {event['eta']:.0f} s)", file=sys.stderr)
        elif kind == "checkpoint":
            print(f"checkpoint at step {event['step']}: {event['path']}", file=sys.stderr)

    result = _run(prepared.request, on_event)
    record = result["provenance"]
    if args.json:
        emit_json(result)
        return 0
    print(f"trained adapter {result['adapter']} in {record['steps']} steps "
          f"({record['time']['train_seconds']:.0f} s), loss {record['loss']['first']:.4f} "
          f"→ {record['loss']['last']:.4f}")
    _print_files(result)
    print(f"  run directory: {result['run_dir']} (provenance.json beside the adapter)")
    if result.get("variant"):
        print(f"  variant {result['variant']} = {args.base} + {result['adapter']}")
    return 0


def cmd_train_rl(catalog: Catalog, args: argparse.Namespace) -> int:
    """The reinforcement loop (engine.training.rl): sample, score, train in rounds."""
    from engine.training import ENABLE_HINT, torch_available
    from engine.training.rl import TRAIN_KEYS, RLRequest, RLSettings, prepare

    if not torch_available():
        raise RefusedError(ENABLE_HINT)
    settings = {key: getattr(args, key) for key in sorted(TRAIN_KEYS)
                if getattr(args, key) is not None}
    rl = {key: getattr(args, key) for key in RLSettings.__dataclass_fields__
          if getattr(args, key) is not None}
    request = RLRequest(name=args.name, base=args.base, prompts=str(args.prompts),
                        reward=args.reward, settings=settings, rl=rl,
                        init_adapter=args.init_adapter)
    prepared = prepare(catalog, request)  # refuse a bad request before starting anything
    quiet = bool(args.json)

    def on_event(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "warning":
            print(f"warning: {event['message']}", file=sys.stderr)
        elif quiet:
            return
        elif kind == "stage":
            print(f"{event['stage']}…", file=sys.stderr)
        elif kind == "memory":
            print(f"memory: {memory.summary(event)}", file=sys.stderr)
        elif kind == "data":
            print(f"prompts: {event['examples']} ({event['prompt_tokens']} tokens), sha256 "
                  f"{event['sha256'][:16]}…", file=sys.stderr)
        elif kind == "round":
            reward, agree = event["reward"], event["agreement"]
            print(f"round {event['round']}/{event['rounds']}: reward {reward['mean']:.3f} "
                  f"(min {reward['min']:.3f}, max {reward['max']:.3f}); trainer vs sampler "
                  f"mean |Δ| {agree['mean_abs']:.4f}, max {agree['max_abs']:.3f}, "
                  f"{agree['within']:.0%} within {agree['tolerance']:g}; {event['steps']} "
                  f"step{'s' if event['steps'] != 1 else ''} ({event['seconds']:.0f} s)",
                  file=sys.stderr)

    result = _run(prepared.request, on_event)
    record = result["provenance"]
    if args.json:
        emit_json(result)
        return 0
    rounds = record["rl"]["rounds"]
    print(f"trained adapter {result['adapter']} in {len(rounds)} rounds, {record['steps']} "
          f"steps ({record['time']['train_seconds']:.0f} s), mean reward "
          f"{rounds[0]['reward']['mean']:.3f} → {rounds[-1]['reward']['mean']:.3f}")
    _print_files(result)
    print(f"  run directory: {result['run_dir']} (provenance.json beside the adapter, "
          "rollouts in rounds/)")
    return 0


def _run(request: Any, on_event: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """A training job to its end. Ctrl-C asks the worker to stop and waits for it (a
    minute at most) before the interrupt goes on to the command's handler."""
    from engine.training.client import TrainingJob

    job = TrainingJob(request, on_event).start()
    try:
        return job.wait()
    except KeyboardInterrupt:
        job.cancel()
        job.done.wait(60)
        raise


def _print_files(result: dict[str, Any]) -> None:
    from engine.training import served_check

    files = result["files"]
    print(f"  GGUF (llama.cpp): sha256 {files['gguf']['sha256']}")
    print(f"  PEFT (OpenVINO):  sha256 {files['peft']['sha256']}")
    for line in served_check.summary_lines(result.get("checks") or {}):
        print(f"  {line}")
