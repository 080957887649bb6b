"""What `list` and `show` report about catalog entries, as plain dicts.

The CLI prints these (or emits them as JSON) and the GUI's detail pane renders the
same dicts, so both surfaces always show the same provenance, checks and identity.
"""

from __future__ import annotations

from typing import Any

from engine import catalog as catalog_mod
from engine import validation
from engine.catalog import Catalog
from engine.errors import StudioError


def list_entries(catalog: Catalog) -> dict[str, list[dict[str, Any]]]:
    data = catalog.data()
    models = []
    for record in data["models"].values():
        status = catalog.verify_base(record["name"])
        models.append({**_public(record), "status": "ok" if status.ok else "changed",
                       "problem": None if status.ok else status.detail})
    adapters = [_public(r) for r in data["adapters"].values()]
    variants = [variant_entry(catalog, r) for r in data["variants"].values()]
    return {"models": models, "adapters": adapters, "variants": variants}


def _public(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("name", "kind", "backend", "format", "sha256", "path", "curated", "source",
            "installed_at", "size", "base", "verified", "default_scale")
    return {k: record[k] for k in keys if k in record}


def variant_entry(catalog: Catalog, record: dict[str, Any]) -> dict[str, Any]:
    adapters = []
    for a in record["adapters"]:
        try:
            sha = catalog.adapter_file(a["name"], record["backend"])["sha256"]
        except StudioError:
            sha = None
        adapters.append({"name": a["name"], "scale": a["scale"], "sha256": sha})
    try:
        identity: str | None = catalog.identity(record["name"]).key
    except StudioError:
        identity = None
    return {"name": record["name"], "kind": "variant", "backend": record["backend"],
            "base": record["base"], "adapters": adapters, "identity": identity,
            "curated": record["curated"], "profile": record["profile"],
            "created_at": record.get("created_at")}


def show_entry(catalog: Catalog, name: str) -> dict[str, Any]:
    kind, record = catalog.find(name)
    if kind == "model":
        status = catalog.verify_base(name)
        out = {**_public(record), "metadata": record["metadata"],
               "identity": catalog.identity(name).key,
               "checks": [validation.Check("digest", "pass" if status.ok else "fail",
                                           status.detail).to_dict()]}
        for key in ("built_from", "counterparts"):
            if key in record:
                out[key] = record[key]
    elif kind == "adapter":
        report = catalog.recheck_adapter(name)
        out = {**_public(record), "config_sha256": record.get("config_sha256"),
               "expected_base_sha256": record.get("expected_base_sha256"),
               "metadata": record["metadata"], "checks": report.to_list(),
               "status": report.status}
        for key in ("rank", "alpha", "targets"):
            out[key] = record["metadata"].get(key)
        if "provenance" in record:
            out["provenance"] = record["provenance"]
        out["files"] = adapter_files(catalog, name)
    else:
        out = variant_entry(catalog, record)
        checks = []
        base_status = catalog.verify_base(record["base"])
        checks.append(validation.Check("base", "pass" if base_status.ok else "fail",
                                       f"{record['base']}: {base_status.detail}").to_dict())
        for a in record["adapters"]:
            report = catalog.recheck_adapter(a["name"], record["base"])
            checks.append({"name": f"adapter {a['name']}", "status": report.status,
                           "detail": report.reason()})
            checks.append(validation.check_scale(a["scale"]).to_dict())
        out["checks"] = checks
        ident = catalog.identity(name)
        out["identity_detail"] = ident.to_dict()
        out["backends"] = variant_backends(catalog, name)
    out["kind"] = kind
    return out


def adapter_files(catalog: Catalog, name: str) -> dict[str, dict[str, Any]]:
    """Every file an adapter carries, one per backend, each with its own digest and checks."""
    record = catalog.adapter(name)
    files: dict[str, dict[str, Any]] = {}
    for backend in catalog_mod.BACKENDS:
        try:
            entry = catalog.adapter_file(name, backend)
        except StudioError:
            continue
        report = catalog.recheck_adapter(name, entry["base"])
        files[backend] = {"format": entry["format"], "path": entry["path"],
                          "sha256": entry["sha256"], "config_sha256": entry.get("config_sha256"),
                          "base": entry["base"], "source": entry.get("source"),
                          "primary": backend == record["backend"], "status": report.status,
                          "reason": report.reason()}
    return files


def variant_backends(catalog: Catalog, name: str) -> dict[str, dict[str, Any]]:
    """For each backend: the base, adapter files and identity a variant is served with there."""
    record = catalog.variant(name)
    out: dict[str, dict[str, Any]] = {}
    for backend in catalog_mod.BACKENDS:
        try:
            base = catalog.serving_base(name, backend)
            ident = catalog.identity(name, backend=backend)
        except StudioError as exc:
            out[backend] = {"available": False, "reason": exc.message}
            continue
        out[backend] = {"available": True, "base": base, "identity": ident.key,
                        "adapters": [{"name": a["name"], "scale": a["scale"],
                                      "sha256": catalog.adapter_file(a["name"], backend)["sha256"]}
                                     for a in record["adapters"]]}
    return out


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
