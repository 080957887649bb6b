"""What `list` and `show` report about catalog entries, as plain dicts. Reads only.

The CLI prints these (or emits them as JSON) and the GUI's detail pane renders the
same dicts, so both surfaces always show the same provenance, checks and identity.
Entries that are available but not built yet (the curated OpenVINO default before its
first use) are not records: the caller passes them in as `pending` (see
`engine.curated.pending`), each a `list` model entry with `built: False`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.catalog import evaluation, health, merged, resolve, validation
from engine.catalog.store import BACKENDS, Catalog, now_iso
from engine.catalog.trust.display import entry as signature_entry
from engine.catalog.trust.policy import check_row
from engine.catalog.trust.verify import Verdict
from engine.errors import StudioError, UnknownNameError
from engine.formats import capabilities, gguf_file

Pending = Sequence[dict[str, Any]]


def list_entries(catalog: Catalog, pending: Pending = ()) -> dict[str, list[dict[str, Any]]]:
    """Every catalog entry, plus the `pending` models (available, not built yet).

    Models carry `built`: True for catalog records, False for pending ones, so the
    OpenVINO default a fresh catalog builds on first use is visible before that.
    """
    data = catalog.data()
    models = []
    for record in data["models"].values():
        status = catalog.verify_base(record["name"])
        entry = {**_public(record), "built": True,
                 "status": "ok" if status.ok else "changed",
                 "problem": None if status.ok else status.detail}
        if "merged_from" in record:  # what a library badge needs: a merge, erased or not
            entry["merged_from"] = merged.badge(record["merged_from"])
        entry.update(_compute(catalog, record["name"]))
        models.append(entry)
    models.extend(pending)
    adapters = [_public(r) for r in data["adapters"].values()]
    variants = [variant_entry(catalog, r) for r in data["variants"].values()]
    return {"models": models, "adapters": adapters, "variants": variants}


def _public(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("name", "kind", "backend", "format", "sha256", "path", "curated", "source",
            "installed_at", "size", "base", "verified", "default_scale", "download",
            "served_check")
    return {k: record[k] for k in keys if k in record}


def _signature_row(catalog: Catalog, name: str) -> tuple[dict[str, Any], dict[str, str] | None]:
    """An adapter's `signature` field and its check row (none: unsigned under off)."""
    found = signature_entry(catalog, name)
    return found, check_row(Verdict.from_dict(found), found["required"], found["policy"])


def variant_entry(catalog: Catalog, record: dict[str, Any]) -> dict[str, Any]:
    adapters = []
    for a in record["adapters"]:
        try:
            sha = catalog.adapter_file(a["name"], record["backend"])["sha256"]
        except StudioError:
            sha = None
        adapters.append({"name": a["name"], "scale": a["scale"], "sha256": sha})
    try:
        identity: str | None = resolve.identity(catalog, record["name"]).key
    except StudioError:
        identity = None
    return {"name": record["name"], "kind": "variant", "backend": record["backend"],
            "base": record["base"], "adapters": adapters, "identity": identity,
            "curated": record["curated"], "profile": record["profile"],
            "created_at": record.get("created_at"), **_compute(catalog, record["name"])}


def _compute(catalog: Catalog, name: str) -> dict[str, Any]:
    """`compute`: the OpenVINO profile it is served with by default (docs/formats.md,
    "Profiles"), as a label (`fast (int4 @ f32)`); nothing for a base without profiles.
    (`profile` is already a variant's sampling profile.)"""
    try:
        compute = resolve.identity(catalog, name).compute
    except StudioError:
        return {}
    return {"compute": compute.label()} if compute is not None else {}


def profile_rows(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A base's OpenVINO profiles for a report: weights, precisions, size and digest."""
    return {name: {k: entry.get(k) for k in ("weights", "precision", "kv_cache", "size",
                                             "sha256", "recipe")}
            for name, entry in (record.get("profiles") or {}).items()}


def show_entry(catalog: Catalog, name: str, pending: Pending = ()) -> dict[str, Any]:
    try:
        kind, record = catalog.find(name)
    except UnknownNameError:
        # A pending model (the OpenVINO default before its first use) is explained,
        # not built: showing something must never start a 30 s build.
        for entry in pending:
            if entry["name"] == name:
                return _pending_show(entry)
        raise
    if kind == "model":
        status = catalog.verify_base(name)
        out = {**_public(record), "metadata": record["metadata"],
               "identity": resolve.identity(catalog, name).key,
               "checks": [validation.Check("digest", "pass" if status.ok else "fail",
                                           status.detail).to_dict()]}
        for key in ("built_from", "counterparts"):
            if key in record:
                out[key] = record[key]
        if record.get("format") == "gguf" and status.ok:
            out["capabilities"] = base_capabilities(record["path"])
        out.update(_compute(catalog, name))
        if record.get("profiles"):
            out["profiles"] = profile_rows(record)
        if "merged_from" in record:
            # A merge is a plain base now: say so first, with how it was made.
            out["merge"] = merged.summary(record["merged_from"])
            out["merged_from"] = record["merged_from"]
            out["checks"].append(merged.check(record).to_dict())
    elif kind == "adapter":
        report = health.recheck_adapter(catalog, name)
        out = {**_public(record), "config_sha256": record.get("config_sha256"),
               "expected_base_sha256": record.get("expected_base_sha256"),
               "metadata": record["metadata"], "checks": report.to_list(),
               "status": report.status}
        for key in ("rank", "alpha", "targets"):
            out[key] = record["metadata"].get(key)
        if "provenance" in record:
            out["provenance"] = record["provenance"]
        found = evaluation.report(catalog, name)
        if found is not None:  # its evaluation set and the latest scores on it
            out["evaluation"] = found
        out["signature"], row = _signature_row(catalog, name)
        if row is not None:
            out["checks"].append(row)
        served = record.get("served_check")
        if isinstance(served, dict):  # the training run's check of it as llama.cpp serves it
            out["checks"].append({"name": "served check",
                                  "status": "pass" if served.get("passed") else "fail",
                                  "detail": served.get("reason") or
                                  "the trainer and llama.cpp agree, and drift is small"})
        out["files"] = adapter_files(catalog, name)
        for backend, item in out["files"].items():
            if item.get("cross_check"):  # the last parity run's findings, warnings included
                found = item["cross_check"]
                status = "warn" if found["openvino_warnings"] or found[
                    "unused_lora_tensors"] else "pass"
                out["checks"].append({"name": f"cross-check ({backend})", "status": status,
                                      "detail": cross_check_line(found)})
    else:
        out = variant_entry(catalog, record)
        checks = []
        base_status = catalog.verify_base(record["base"])
        checks.append(validation.Check("base", "pass" if base_status.ok else "fail",
                                       f"{record['base']}: {base_status.detail}").to_dict())
        for a in record["adapters"]:
            report = health.recheck_adapter(catalog, a["name"], record["base"])
            checks.append({"name": f"adapter {a['name']}", "status": report.status,
                           "detail": report.reason()})
            checks.append(validation.check_scale(a["scale"]).to_dict())
        out["checks"] = checks
        ident = resolve.identity(catalog, name)
        for a in record["adapters"]:
            with contextlib.suppress(StudioError):
                row = _signature_row(catalog, a["name"])[1]
                if row is not None:
                    checks.append({**row, "name": f"signature {a['name']}"})
        out["identity_detail"] = ident.to_dict()
        out["backends"] = variant_backends(catalog, name, pending)
        # The evaluation sets of its adapters: this variant's and the bases' scores.
        models = set(catalog.data()["models"]) | {name}
        out["evaluation"] = [found for a in record["adapters"]
                             if (found := evaluation.report(catalog, a["name"], models))]
    out["kind"] = kind
    return out


def base_capabilities(path: str) -> list[dict[str, Any]]:
    """What a GGUF base can be used for, feature by feature (formats.capabilities)."""
    try:
        header = gguf_file.read_header(Path(path))
    except StudioError as exc:
        return [{"name": "read", "ok": False, "reason": exc.message}]
    return [c.to_dict() for c in capabilities.for_header(header)]


def adapter_files(catalog: Catalog, name: str) -> dict[str, dict[str, Any]]:
    """Every file an adapter carries, one per backend, each with its own digest and checks."""
    record = catalog.adapter(name)
    files: dict[str, dict[str, Any]] = {}
    for backend in BACKENDS:
        try:
            entry = catalog.adapter_file(name, backend)
        except StudioError:
            continue
        report = health.recheck_adapter(catalog, name, entry["base"])
        files[backend] = {"format": entry["format"], "path": entry["path"],
                          "sha256": entry["sha256"], "config_sha256": entry.get("config_sha256"),
                          "base": entry["base"], "source": entry.get("source"),
                          "primary": backend == record["backend"], "status": report.status,
                          "reason": report.reason(), "cross_check": entry.get("cross_check")}
    return files


# At most this many stderr lines are kept in a catalog record (`parity --json` has all).
CROSS_CHECK_LINES = 50


def cross_check_summary(name: str, result: Any) -> dict[str, Any]:
    """What an adapter's record keeps of a `parity` run (the engine's cross-check
    result, `engine.runtime.results.CrossCheckResult`: this room reads its fields)."""
    genai = result.genai
    warnings = list(result.openvino_warnings)
    return {
        "at": now_iso(), "via": name, "tokens": result.tokens,
        "prompts": len(result.prompts), "max_kl": result.max_kl,
        "mean_kl": result.mean_kl, "top1_agreement": result.top1_agreement,
        "first_token_agreement": result.first_token_agreement,
        "genai": genai is not None,
        "genai_agreeing_tokens": list(genai.agreeing_tokens) if genai else None,
        "openvino_warnings": warnings[:CROSS_CHECK_LINES],
        "openvino_warning_count": len(warnings),
        "unused_lora_tensors": list(result.unused_lora_tensors),
    }


def cross_check_line(found: dict[str, Any]) -> str:
    """One readable line for a recorded cross-check (see `cross_check_summary`)."""
    how = "parity --genai" if found.get("genai") else "parity"
    unused = found["unused_lora_tensors"]
    count = found.get("openvino_warning_count", len(found["openvino_warnings"]))
    text = (f"{how} {found['via']} ({found['at']}): KL max {found['max_kl']:.4f} nats, "
            f"top-1 {found['top1_agreement']:.2f}; OpenVINO warnings: {count or 'none'}; "
            f"unused LoRA tensors: {len(unused) or 'none'}")
    if found.get("genai_agreeing_tokens") is not None:
        text += f"; GenAI greedy agreement {found['genai_agreeing_tokens']}"
    if unused:
        text += " (" + ", ".join(unused[:4]) + (", …" if len(unused) > 4 else "") + ")"
    return text


def variant_backends(catalog: Catalog, name: str, pending: Pending = ()
                     ) -> dict[str, dict[str, Any]]:
    """For each backend: the base, adapter files and identity a variant is served with there."""
    record = catalog.variant(name)
    out: dict[str, dict[str, Any]] = {}
    for backend in BACKENDS:
        try:
            base = resolve.serving_base(catalog, name, backend)
            ident = resolve.identity(catalog, name, backend=backend)
        except StudioError as exc:
            out[backend] = {"available": False, "reason": _unavailable_reason(
                catalog, record, backend, exc.message, pending)}
            continue
        out[backend] = {"available": True, "base": base, "identity": ident.key,
                        "adapters": [{"name": a["name"], "scale": a["scale"],
                                      "sha256": catalog.adapter_file(a["name"], backend)["sha256"]}
                                     for a in record["adapters"]]}
    return out


def _unavailable_reason(catalog: Catalog, variant: dict[str, Any], backend: str,
                        reason: str, pending: Pending) -> str:
    """Why a variant cannot run on `backend`; when that is only because its base there
    is pending (not built yet), say how it gets built and what else is missing."""
    entry = next((p for p in pending if p["backend"] == backend
                  and variant["base"] in p["counterparts"].values()), None)
    if entry is None:
        return reason
    missing = []
    for a in variant["adapters"]:
        try:
            record = catalog.adapter(a["name"])
        except StudioError:
            return reason  # a broken variant: its own reason says what is wrong
        # Adapters the build gives a file for (the curated demo's) are not missing.
        if backend not in record.get("files", {}) and record.get("backend") != backend \
                and a["name"] not in entry.get("attaches", ()):
            missing.append(a["name"])
    then = "".join(f"; then adapter {name} needs an OpenVINO file (`variant-studio adapter "
                   f"convert {name}`)" for name in missing)
    return f"its OpenVINO base {entry['name']} is not built yet: {entry['how']}{then}"


def _pending_show(entry: dict[str, Any]) -> dict[str, Any]:
    """A pending model as `show` reports it: with checks that explain the state."""
    mirrors = entry["counterparts"].get("llama")
    return {**entry, "identity": None,  # an identity needs the built model's digest
            "checks": [
                {"name": "built", "status": "warn", "detail": f"not built yet: {entry['how']}"},
                {"name": "source", "status": "pass",
                 "detail": f"the embedded model {entry['built_from']['path']} is installed"
                           + (f" (the llama.cpp model {mirrors})" if mirrors else "")},
            ]}


def download_line(record: dict[str, Any]) -> str:
    """Where a downloaded entry came from, in one line (`show`, the detail pane)."""
    if record.get("url"):
        where = str(record["url"])
    else:
        where = (f"Hugging Face {record.get('repo')}: {', '.join(record.get('files', []))} "
                 f"at {record.get('revision')}"
                 + (f" (commit {record['commit']})" if record.get("commit") else ""))
    checked = ", sha256 checked" if record.get("sha256_checked") else ""
    return f"{where} on {record.get('downloaded_at')}{checked}"


def provenance_lines(record: dict[str, Any]) -> list[str]:
    """A training provenance record as readable lines (`show --json` has all of it)."""
    if record.get("format", "").split("/")[0] != "variant-studio-provenance":
        return [f"{key}: {value}" for key, value in record.items()]
    data, files = record.get("data", {}), record.get("adapter_files", {})
    config = record.get("config", {})
    init = record.get("init_adapter")
    loss, when = record.get("loss", {}), record.get("time", {})
    plat = record.get("platform", {})
    lines = [
        f"base_sha256: {record.get('base_sha256')}",
        f"data_sha256: {record.get('data_sha256')} ({data.get('file')}, "
        f"{data.get('examples')} examples, {data.get('target_tokens')} target tokens)",
        f"adapter_sha256: {record.get('adapter_sha256')} (GGUF)",
    ]
    if "peft" in files:
        lines.append(f"peft_sha256: {files['peft'].get('sha256')} (OpenVINO export)")
    kl_text = record.get("kl_text")
    if isinstance(kl_text, dict):
        lines.append(f"kl_text_sha256: {kl_text.get('sha256')} ({kl_text.get('file')}, "
                     f"{kl_text.get('passages')} passages the KL penalty was measured on)")
    lines += [
        f"seed: {record.get('seed')}",
        f"method: {record.get('method')}",
        "config: " + " ".join(f"{k}={','.join(v) if isinstance(v, list) else v}"
                              for k, v in sorted(config.items())),
        "init_adapter: " + (f"{init.get('name')} (sha256 {init.get('sha256')})"
                            if init else "none (trained from scratch)"),
    ]
    if record.get("resumed_from"):
        lines.append(f"resumed_from: step {record['resumed_from'].get('step')}")
    lines += [
        "versions: " + ", ".join(f"{k} {v}" for k, v in sorted(
            record.get("versions", {}).items())),
        f"platform: {plat.get('system')} {plat.get('machine')}, {plat.get('cpu')}, "
        f"{plat.get('cpu_count')} CPUs",
        f"steps: {record.get('steps')} in {when.get('train_seconds')} s "
        f"({when.get('started')} to {when.get('finished')})",
    ]
    if loss.get("steps"):
        lines.append(f"loss: {loss['first']:.4f} → {loss['last']:.4f} (min "
                     f"{loss['min']:.4f}, mean of the last 10 steps "
                     f"{loss['mean_last_10']:.4f})")
    return lines
