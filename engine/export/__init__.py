"""Export a variant for another server engine: `export_variant(catalog, name, target,
out)` writes what a team needs to serve the same variant with llama-server, vLLM or
OpenVINO Model Server (merged: it has no LoRA for text generation).

Every export folder holds `manifest.json` (each file written with its sha256 and size,
the variant's identity, base and adapters with digests and scales) and a `README.md`
for the team that serves it; the targets' own files are described in
`engine.export.llama_server`, `engine.export.vllm` and `engine.export.ovms`. Each
provides one `engine.export.target.Target` (its name, its options as a frozen
dataclass, how they are read from the command line, how its files are written),
registered in `TARGETS`; callers reach a target through that interface only.

Bad input changes nothing. The variant is resolved and every file it is served from
re-hashed before anything is written; the export is written into a staging folder
beside DIR and only renamed into place once complete, so a failure leaves no partial
export. DIR must be new, empty, or a previous export of the same variant, holding
nothing but the files its manifest lists (it is then replaced as a whole); anything
else is refused, since a folder holding other files may be someone's work. File names
inside DIR are fixed or catalog names (already restricted to safe characters), never
taken from a model's metadata.

Nothing here imports torch or transformers: neither is needed to export.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from engine import __version__
from engine.catalog.store import Catalog, now_iso
from engine.errors import RefusedError, UsageError
from engine.export import llama_server, ovms, vllm
from engine.export.common import (
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    Plan,
    Progress,
    file_sha256,
    make_plan,
    write_json,
)
from engine.export.target import Target
from engine.formats import capabilities, gguf_file
from engine.formats.safeio import printable

# Every target, by its --target name, in the order the command lists them.
TARGETS: dict[str, Target[Any]] = {t.name: t for t in (llama_server.target, vllm.target,
                                                       ovms.target)}


def export_variant(catalog: Catalog, name: str, target: str, out: Path,
                   options: object | None = None,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Export variant `name` for `target` (a name in `TARGETS`) into folder `out`;
    returns the manifest.

    `options` is the target's options (`TARGETS[target].options_type`, built from the
    command line by its `options_from`); None is the target's plain export."""
    if target not in TARGETS:
        raise UsageError(f"unknown export target {target!r} ({_names()})")
    chosen = TARGETS[target]
    if options is None:
        options = chosen.options_type()
    elif not isinstance(options, chosen.options_type):
        raise TypeError(f"the {target} export takes {chosen.options_type.__name__}, not "
                        f"{type(options).__name__}")
    out = Path(out).expanduser().absolute()
    check_destination(out, name)
    plan = make_plan(catalog, name)
    capabilities.require(gguf_file.read_header(Path(plan.base_path)), chosen.capability)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the export from its team
        section = chosen.write(catalog, plan, staging, options, progress)
        manifest = build_manifest(plan, target, section, staging)
        write_json(staging / MANIFEST, manifest)
        check_destination(out, name)  # again: the folder may have changed meanwhile
        _replace(out, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _names() -> str:
    """The targets' names as a sentence lists them: "a, b or c"."""
    names = list(TARGETS)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def build_manifest(plan: Plan, target: str, section: dict[str, Any],
                   folder: Path) -> dict[str, Any]:
    adapters = []
    for part, extra in zip(plan.adapters, section["adapters"], strict=True):
        adapters.append({
            "name": part.name, "sha256": part.sha256, "scale": part.scale,
            "rank": part.rank, "alpha": part.alpha, "targets": list(part.targets),
            "multiplier": part.multiplier, **extra,
        })
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "target": target,
        "created_by": f"variant-studio {__version__}", "created_at": now_iso(),
        "variant": {"name": plan.variant, "identity": plan.identity["key"],
                    "identity_detail": plan.identity, "profile": plan.profile},
        "base": {"name": plan.base_name, "sha256": plan.base_sha256,
                 "source": plan.base_source, **section["base"]},
        "adapters": adapters,
        "serve": section["serve"],
        "files": list_files(folder),
    }
    for key in ("lora", "merge"):
        if key in section:
            manifest[key] = section[key]
    return manifest


def list_files(folder: Path) -> list[dict[str, Any]]:
    """Every file under `folder` but the manifest: path (POSIX, relative), sha256, size."""
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if relative != MANIFEST:
            out.append({"path": relative, "sha256": file_sha256(path),
                        "size": path.stat().st_size})
    return out


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of an export in `folder`, or None if it holds no export of ours."""
    path = folder / MANIFEST
    if not path.is_file() or path.is_symlink():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if (not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT
            or not isinstance(manifest.get("variant"), dict)
            or not isinstance(manifest.get("files"), list)
            or not all(isinstance(f, dict) and isinstance(f.get("path"), str)
                       for f in manifest["files"])):
        return None
    return manifest


def check_files(folder: Path) -> list[str]:
    """Problems with an export folder: files the manifest lists that are missing or
    whose sha256 differs, and files it does not list (empty when all is well)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return [f"{folder}: no export manifest"]
    problems = []
    listed = set()
    for entry in manifest["files"]:
        listed.add(entry["path"])
        path = folder / entry["path"]
        if Path(entry["path"]).is_absolute() or ".." in Path(entry["path"]).parts:
            problems.append(f"outside the folder: {printable(entry['path'])}")
        elif not path.is_file():
            problems.append(f"missing: {entry['path']}")
        elif file_sha256(path) != entry.get("sha256"):
            problems.append(f"sha256 differs: {entry['path']}")
    for extra in sorted(set(_relative_files(folder)) - listed - {MANIFEST}):
        problems.append(f"not in the manifest: {extra}")
    return problems


def check_destination(out: Path, name: str) -> None:
    """Refuse a destination the export must not write into (see the module docstring)."""
    if out.is_symlink():
        raise RefusedError(f"{printable(str(out))} is a symbolic link: give the folder itself")
    if not out.exists():
        if not out.parent.is_dir():
            raise UsageError(f"{printable(str(out.parent))} does not exist (the export "
                             "creates only its own folder)")
        return
    if not out.is_dir():
        raise RefusedError(f"{printable(str(out))} exists and is not a folder")
    if not any(out.iterdir()):
        return
    previous = read_manifest(out)
    if previous is None or previous["variant"].get("name") != name:
        raise RefusedError(f"{printable(str(out))} is not empty and holds no export of "
                           f"{name}: give a new or empty folder")
    listed = {entry["path"] for entry in previous["files"]} | {MANIFEST}
    for relative in _relative_files(out):
        if relative not in listed:
            raise RefusedError(f"{printable(str(out))} holds {printable(relative)!r}, which "
                               f"is not part of the previous export of {name}: not replacing "
                               "it")


def _relative_files(folder: Path) -> list[str]:
    """Every non-directory entry under `folder` (symbolic links included), relative."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_symlink() or not p.is_dir())


def _replace(out: Path, staging: Path) -> None:
    """Put the staged export at `out`, replacing an empty folder or a previous export."""
    if not out.exists():
        os.rename(staging, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    old.rmdir()
    os.rename(out, old)
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
