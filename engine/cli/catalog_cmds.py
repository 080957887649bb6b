"""The catalog commands: model, adapter, variant, list, show, remove."""

from __future__ import annotations

import argparse
import sys

from engine.catalog import downloads, entries, evaluation, imports, resolve
from engine.catalog.store import AdapterSpec, Catalog
from engine.cli.output import (
    ICONS,
    build_progress,
    emit_json,
    progress,
    stage_line,
    transfer_progress,
)
from engine.curated import embedded, openvino_default, setup
from engine.errors import StudioError, UsageError
from engine.formats import lora_io
from engine.runtime.openvino import models as openvino_models


def ensure_openvino_default(catalog: Catalog, args: argparse.Namespace) -> None:
    """Build and add the curated OpenVINO default the first time something needs it."""
    if command_uses_openvino_default(catalog, args) and not openvino_default.is_registered(
            catalog):
        record = openvino_default.ensure_default(catalog, progress=build_progress())
        print(f"added curated model {record['name']} (openvino, sha256 "
              f"{record['sha256'][:16]}…)", file=sys.stderr)


def command_uses_openvino_default(catalog: Catalog, args: argparse.Namespace) -> bool:

    command, action = args.command, getattr(args, "action", None)
    if command == "score":  # several names: as if each were generated from alone
        return any(command_uses_openvino_default(catalog, argparse.Namespace(
            command="generate", name=name, backend=args.backend)) for name in args.names)
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
    return base == embedded.DEFAULT_MODEL_NAME

def cmd_model(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.action == "openvino-default":

        record = openvino_default.ensure_default(catalog, progress=build_progress())
        built = record.get("built_from", {})
        print(f"{record['name']}: openvino, sha256 {record['sha256'][:16]}…, {record['path']}")
        print(f"  built from {built.get('path')} ({built.get('recipe')}; "
              f"{built.get('layers_named')} layers named by structure, "
              f"{built.get('names_cross_checked')} cross-checked)")
        return 0
    source = download_source(args, "model")
    if source is not None:
        record = downloads.download_model(catalog, args.name, source, args.backend,
                                          progress=transfer_progress(args.name),
                                          stage=stage_line(args.name))
    else:
        if args.sha256:
            downloads.verify_sha256(args.file, downloads.check_sha256(args.sha256),
                                    remember=True)
        # A GGUF for OpenVINO is built into a named IR first (refused, with the reason,
        # when OpenVINO cannot compute its family or RoPE as llama.cpp does).
        record = openvino_models.add_model(
            catalog, args.name, args.file, args.backend, args.source, args.curated,
            progress=progress(f"hashing {args.file.name}"),
            stages=build_progress(f"{args.name} for OpenVINO"))
    print(f"added model {record['name']} ({record['backend']}, sha256 {record['sha256'][:16]}…)")
    return 0


def download_source(args: argparse.Namespace, kind: str) -> downloads.Source | None:
    """The download `model add` / `adapter add` asks for (None: --file), checked."""
    if args.file is not None:
        if args.filename or args.revision:
            raise UsageError("--filename and --revision go with --hf")
        return None
    if args.source:
        raise UsageError("--source goes with --file (a download records its URL or repo)")
    if getattr(args, "curated", False):
        raise UsageError("--curated goes with --file")
    return downloads.Source.parse(kind, url=args.url, repo=args.hf, filename=args.filename,
                                  revision=args.revision, sha256=args.sha256)


def cmd_adapter(catalog: Catalog, args: argparse.Namespace) -> int:
    if args.action == "convert":
        record = catalog.adapter(args.name)
        backend = args.backend or ("openvino" if record["backend"] == "llama" else "llama")
        entry = imports.convert_adapter(catalog, args.name, backend, args.base)
        print(f"adapter {args.name}: added a {backend} file ({entry['format']}, sha256 "
              f"{entry['sha256'][:16]}…) validated for {entry['base']}")
        for check in entry["checks"]:
            if check["status"] != "pass":
                print(f"  {ICONS[check['status']]} {check['name']}: {check['detail']}")
        return 0
    if args.action == "convert-file":

        meta = catalog.model(args.base or embedded.DEFAULT_MODEL_NAME)["metadata"]
        if args.target.exists():
            raise UsageError(f"{args.target} already exists")
        # The base's family decides the names and whether q/k rows move; an adapter
        # for another family is refused (pass --base for it).
        base = lora_io.Layout.of(meta.get("architecture"), int(meta["head_count"]),
                                 int(meta.get("head_count_kv") or meta["head_count"]))
        out = lora_io.convert_file(args.source, args.target, base)
        print(f"wrote {out}")
        return 0
    source = download_source(args, "adapter")
    if source is not None:
        record = downloads.download_adapter(catalog, args.name, args.base, source, args.strict,
                                            progress=transfer_progress(args.name),
                                            stage=stage_line(args.name))
    else:
        if args.sha256:
            downloads.verify_sha256(args.file, downloads.check_sha256(args.sha256))
        record = imports.add_adapter(catalog, args.name, args.base, args.file, args.source,
                                     args.strict, progress=progress(f"copying {args.file.name}"))
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
    ident = resolve.identity(catalog, record["name"])
    print(f"added variant {record['name']} = {record['base']} + "
          + " + ".join(f"{a['name']}@{a['scale']:g}" for a in record["adapters"])
          + f" (identity {ident.short})")
    return 0


def cmd_list(catalog: Catalog, args: argparse.Namespace) -> int:

    listing = entries.list_entries(catalog, setup.pending_entries(catalog))
    if args.json:
        emit_json(listing)
        return 0
    print("Base models")
    for m in listing["models"]:
        flag = "curated" if m["curated"] else "user"
        if not m.get("built", True):  # the OpenVINO default before its first use
            print(f"  {m['name']:<32} {m['backend']:<9} {flag:<8} {m['summary']} (or "
                  f"`{openvino_default.BUILD_COMMAND}`)")
            continue
        problem = f"  ✗ {m['problem']}" if m["problem"] else ""
        compute = f"  {m['compute']}" if m.get("compute") else ""
        print(f"  {m['name']:<32} {m['backend']:<9} {flag:<8} {m['sha256'][:12]}{compute}"
              f"{problem}")
    print("Adapters")
    for a in listing["adapters"]:
        flag = "curated" if a["curated"] else "user"
        served = a.get("served_check")
        failed = ("  ✗ served check failed" if isinstance(served, dict)
                  and served.get("passed") is False else "")
        print(f"  {a['name']:<32} {a['backend']:<9} {flag:<8} {a['sha256'][:12]}  "
              f"base {a['base']}{failed}")
    print("Variants")
    for v in listing["variants"]:
        parts = " + ".join(f"{a['name']}@{a['scale']:g}" for a in v["adapters"])
        compute = f"  {v['compute']}" if v.get("compute") else ""
        print(f"  {v['name']:<32} {v['base']} + {parts}  [{(v['identity'] or '?')[:12]}]"
              f"{compute}")
    return 0


def cmd_show(catalog: Catalog, args: argparse.Namespace) -> int:
    entry = entries.show_entry(catalog, args.name, setup.pending_entries(catalog))
    if args.json:
        emit_json(entry)
        return 0
    print(f"{entry['kind']} {entry['name']}")
    skip = {"name", "kind", "checks", "metadata", "identity_detail", "provenance", "profile",
            "files", "backends", "evaluation", "profiles", "capabilities"}
    skip.add("signature")  # one line, below
    skip.add("merged_from")  # `merge` says it in a line; the figures are in --json
    skip.add("download")  # one line, below
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
    for profile, item in entry.get("profiles", {}).items():
        print(f"  OpenVINO profile {profile}: {item['weights']} weights at {item['precision']}"
              f" (KV cache {item['kv_cache']}), {item['size'] / 2**20:.0f} MiB, sha256 "
              f"{item['sha256'][:12]}")
    for backend, item in entry.get("files", {}).items():
        print(f"  file for {backend}: {item['format']} sha256 {item['sha256']} (base "
              f"{item['base']}; {ICONS.get(item['status'], '?')} {item['reason']})")
        if item.get("cross_check"):
            print(f"    {entries.cross_check_line(item['cross_check'])}")
    for backend, item in entry.get("backends", {}).items():
        if item["available"]:
            print(f"  on {backend}: base {item['base']}, identity {item['identity'][:12]}, "
                  + ", ".join(f"{a['name']} sha256 {a['sha256'][:12]}" for a in item["adapters"]))
        else:
            print(f"  on {backend}: not available ({item['reason']})")
    found = entry.get("evaluation")
    for item in [found] if isinstance(found, dict) else found or []:
        print(f"  evaluation set{'' if isinstance(found, dict) else ' of ' + item['adapter']}: "
              f"{item['file']} ({item['rows']} items, {item['kind']}, sha256 "
              f"{item['sha256'][:12]}…, attached {item['attached_at']})")
        for model, per_backend in item["scores"].items():
            for backend, score in per_backend.items():
                print(f"    {evaluation.score_line(model, backend, score)}")
        if not item["scores"]:
            print("    no scores yet (variant-studio score NAME --data FILE)")
    fetched = entry.get("download")
    if isinstance(fetched, dict):
        print(f"  downloaded: {entries.download_line(fetched)}")
    signature = entry.get("signature")
    if isinstance(signature, dict):
        who = f" by {signature['signer']}" if signature["status"] == "valid" else ""
        print(f"  signature: {signature['status']}{who} ({signature['reason']}; policy "
              f"{signature['policy']}{', required' if signature['required'] else ''})")
    for section in ("metadata", "profile", "provenance"):
        if isinstance(entry.get(section), dict):
            print(f"  {section}:")
            lines = (entries.provenance_lines(entry[section]) if section == "provenance" else
                     [f"{key}: {value}" for key, value in entry[section].items()])
            for line in lines:
                print(f"    {line}")
    if entry.get("capabilities"):
        print("  capabilities:")
        for item in entry["capabilities"]:
            print(f"    {ICONS['pass' if item['ok'] else 'fail']} {item['name']}: "
                  f"{item['reason']}")
    if entry.get("checks"):
        print("  checks:")
        for check in entry["checks"]:
            print(f"    {ICONS.get(check['status'], '?')} {check['name']}: {check['detail']}")
    return 0


def cmd_remove(catalog: Catalog, args: argparse.Namespace) -> int:
    kind = catalog.remove(args.name)
    print(f"removed {kind} {args.name}")
    return 0


