"""What a merge starts from and the catalog record it adds: a variant resolved and its
files verified, the staging folder in the model store, the merged file served as a plain
base before it is recorded, and the record itself.

A merge's file is written into a staging folder of `<data>/models/` and, once accepted,
renamed to the model store, `<data>/models/NAME/NAME.gguf` (downloaded models live in
`<data>/models/NAME/` too, under their file's own name; `remove` deletes the folder with
the record), and added as a base model whose record carries `merged_from` (its fields:
`engine.catalog.merged`, which reads them back for `show`, `list` and `doctor`). A
refused or failed merge leaves nothing in the store or the catalog.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.catalog import digest, imports, resolve
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog
from engine.errors import RefusedError, StudioError, UsageError
from engine.formats import artifacts, merge
from engine.state import paths


@dataclass(frozen=True)
class MergeAdapterPart:
    name: str
    path: str
    sha256: str
    scale: float
    rank: int
    alpha: float


@dataclass(frozen=True)
class MergeSource:
    """A variant resolved for a merge, its files verified."""

    variant: str
    base_name: str
    base_path: str
    base_sha256: str
    adapters: tuple[MergeAdapterPart, ...]
    profile: dict[str, Any]
    spec: SessionSpec  # the dynamic variant on llama.cpp

    @property
    def system_prompt(self) -> str:
        return str(self.profile.get("system_prompt") or "")


def store_root() -> Path:
    """The model store (`<data>/models/`, the parent of every `paths.model_store`),
    created if missing."""
    root = paths.model_store("x").parent
    root.mkdir(parents=True, exist_ok=True)
    return root


def model_folder(name: str) -> Path:
    return paths.model_store(name)


def source(catalog: Catalog, name: str) -> MergeSource:
    """Variant `name` as a merge needs it; refuses anything else, in one line."""
    kind, record = catalog.find(name)  # UnknownNameError (exit 4) for an unknown name
    if kind != "variant":
        what = "a base model" if kind == "model" else "an adapter"
        raise UsageError(f"{name!r} is {what}: merge takes a variant (a base model plus "
                         "adapters)")
    spec = resolve.resolve(catalog, name, backend="llama")
    base = catalog.model(spec.base_name)
    if base["backend"] != "llama" or base.get("format") != "gguf":
        raise RefusedError(f"{name}: its base {spec.base_name} is not a GGUF model; merges "
                           "are made from a llama.cpp variant")
    status = catalog.verify_base(spec.base_name)
    if not status.ok:
        raise RefusedError(f"base {spec.base_name}: {status.detail}")
    parts = []
    for adapter in spec.adapters:
        digest.require_unchanged(adapter.name, Path(adapter.path), adapter.sha256)
        info = catalog.adapter_info({"name": adapter.name, "path": adapter.path,
                                     "sha256": adapter.sha256})
        if info.format != "gguf":
            raise RefusedError(f"adapter {adapter.name}: its llama.cpp file is not a GGUF LoRA")
        parts.append(MergeAdapterPart(adapter.name, adapter.path, adapter.sha256,
                                      float(adapter.scale), int(info.rank or 0),
                                      float(info.alpha or 0.0)))
    return MergeSource(name, spec.base_name, spec.base_path, base["sha256"], tuple(parts),
                       resolve.profile(catalog, name), spec)


def staging_dir() -> Path:
    """A fresh staging folder in the store (renamed into place when accepted)."""
    return Path(tempfile.mkdtemp(prefix=".merge-", dir=store_root()))


def temporary_spec(src: MergeSource, path: Path, sha256: str, name: str) -> SessionSpec:
    """The merged file served as a plain base, before it is in the catalog (nothing is
    written): the base's identity with the merged file's name and digest, after its
    chat template and BOS policy were checked against the base's."""
    info = artifacts.inspect_path(Path(path))
    if not isinstance(info, artifacts.BaseModelInfo) or info.format != "gguf":
        raise RefusedError(f"{Path(path).name}: the merge did not give a GGUF base model")
    base_identity = src.spec.identity.base_only()
    if info.chat_template_sha256 != base_identity.chat_template_sha256:
        raise RefusedError("the merged file's chat template differs from its base's")
    if f"add_bos={str(info.add_bos).lower()};bos={info.bos_token_id}" != \
            base_identity.bos_policy:
        raise RefusedError("the merged file's BOS policy differs from its base's")
    identity = replace(base_identity, base_name=name, base_sha256=sha256)
    return SessionSpec(name, "model", identity, name, str(path), (), src.system_prompt,
                       tool_format=src.profile.get("tool_format"))


def merged_from(src: MergeSource, report: dict[str, Any], erased: bool) -> dict[str, Any]:
    """What a merged model's record keeps of how it was made (`engine.catalog.merged`
    says what each field is)."""
    return {
        "format": merge.FORMAT,
        "variant": src.variant,
        "base": src.base_name,
        "base_sha256": src.base_sha256,
        "adapters": [{"name": a.name, "sha256": a.sha256, "scale": a.scale, "rank": a.rank,
                      "alpha": a.alpha} for a in src.adapters],
        "type": report["type"],
        "file_type": report["file"]["file_type"],
        "profile": src.profile,
        "survival": report["survival"],
        "threshold": report["threshold"],
        "erased": bool(erased),
        "weights": report["weights"],
        "behaviour": {k: v for k, v in report["behaviour"].items() if k != "per_item"},
        "task": report.get("task"),
        "eval_set": report["eval_set"],
        "merged_at": report["merged_at"],
        "tool": report["tool"],
    }


def add_merged(catalog: Catalog, name: str, staging: Path, file: Path,
               record_from: dict[str, Any]) -> dict[str, Any]:
    """Rename the staged merge to `<data>/models/NAME/` and add it as a base model; on
    any failure the folder goes and nothing is recorded."""
    folder = model_folder(name)
    final = folder / Path(file).name
    os.rename(staging, folder)
    try:
        digest.moved(Path(file), final)
    except StudioError:
        pass  # costs one more read of the file
    try:
        return imports.add_model(catalog, name, final, backend="llama",
                                 source=f"merge of variant {record_from['variant']} "
                                        f"({record_from['type']})",
                                 extra={"merged_from": record_from})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
