"""The export command: what another server engine (llama-server, vLLM, OpenVINO Model
Server) needs to serve a variant, written into one folder with a manifest and a README
for its team."""

from __future__ import annotations

import argparse
import sys

from engine.catalog.store import Catalog
from engine.cli.output import emit_json
from engine.export import TARGETS, export_variant


def cmd_export(catalog: Catalog, args: argparse.Namespace) -> int:
    def progress(stage: str) -> None:
        if sys.stderr.isatty():
            print(f"export: {stage}", file=sys.stderr, flush=True)

    # The parser offers only the registered targets; the target refuses flags not its own.
    options = TARGETS[args.target].options_from(args)
    manifest = export_variant(catalog, args.name, args.target, args.out, options,
                              progress=progress)
    out = args.out.expanduser().absolute()
    if args.json:
        emit_json({"dir": str(out), **manifest})
        return 0
    size = sum(f["size"] for f in manifest["files"])
    print(f"exported {manifest['variant']['name']} for {manifest['target']} to {out} "
          f"({len(manifest['files']) + 1} files, {size / 1e6:.1f} MB; identity "
          f"{manifest['variant']['identity'][:12]})")
    base = manifest["base"]
    if base.get("merged"):
        found = manifest["merge"]
        print(f"  merged ({base['merge_type']}; the model server has no LoRA for text "
              f"generation): behaviour survival {found['survival']:.3f} (threshold "
              f"{found['threshold']:g}), the stored change carries "
              f"{found['weights']['delta_retained']:.1%} of the adapters' delta")
        print(f"  model: {base['folder']}/ (OpenVINO IR, {base['layers_named']} projections "
              f"named by structure), config.json, {base['folder']}/graph.pbtxt")
    elif base.get("hf_folder"):
        print(f"  base: {base['hf_folder']}/ (Hugging Face, {base['dtype']}, converted from "
              f"{base['name']} sha256 {base['sha256'][:16]}…)")
    elif base.get("copied"):
        print(f"  base: {base['file']} (copied, sha256 {base['sha256'][:16]}…)")
    else:
        print(f"  base: referenced, {base['path']} (sha256 {base['sha256'][:16]}…; "
              "--copy-base copies it)")
    for adapter in manifest["adapters"]:
        if adapter.get("folded"):
            print(f"  adapter {adapter['name']} @ {adapter['scale']:g} (folded into the "
                  "weights)")
            continue
        where = f" -> {adapter['file']}" if adapter.get("file") else ""
        print(f"  adapter {adapter['name']} @ {adapter['scale']:g}{where}")
        peft = adapter.get("catalog_peft")
        if peft is not None and not peft.get("same_tensors"):
            print(f"  ! the catalog's OpenVINO file of {adapter['name']} differs from its "
                  "GGUF; the export follows the GGUF (what llama.cpp serves)")
    if "lora" in manifest:
        print(f"  lora: {manifest['lora']['path']} ({manifest['lora']['folded']})")
    print(f"  serve: {manifest['serve']['command']}")
    print(f"  see {out / 'README.md'}")
    return 0
