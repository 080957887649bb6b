"""One training run from request to catalog entry, with no torch at import time.

`prepare` runs in the caller (CLI or GUI) and refuses a bad request before any
process starts; `execute` runs in the training worker: it verifies the base, reads
and tokenizes the data, trains (importing torch only then), writes the GGUF adapter,
its PEFT export and the provenance record, and imports the adapter (and optionally a
variant) into the catalog.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.catalog import digest, health, imports, resolve
from engine.catalog.store import AdapterSpec, Catalog, now_iso
from engine.catalog.trust.policy import policy as signature_policy
from engine.curated import setup
from engine.errors import Cancelled, RefusedError, UsageError
from engine.formats import lora_io
from engine.formats.artifacts import BaseModelInfo
from engine.formats.safeio import printable
from engine.state import paths
from engine.state.statefile import write_json_atomic
from engine.training import ENABLE_HINT, provenance, torch_available
from engine.training import data as data_mod
from engine.training.config import DETERMINISM_ENV, TrainConfig

Emit = Callable[..., None]
ADAPTER_FILE = "adapter.gguf"
PEFT_DIR = "peft"
PROVENANCE_FILE = "provenance.json"
CHECKPOINT_FILE = "checkpoint.safetensors"


@dataclass(frozen=True)
class TrainRequest:
    """What to train. `settings` holds only the values the user gave; the rest come
    from the starting adapter (rank, alpha, targets) or the defaults."""

    name: str
    base: str
    data: str
    settings: dict[str, Any] = field(default_factory=dict)
    init_adapter: str | None = None
    resume: str | None = None
    variant: str | None = None
    run_dir: str | None = None
    register: bool = True
    kl_text: str | None = None  # unrelated text the KL penalty is measured on

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "data": self.data,
                "settings": dict(self.settings), "init_adapter": self.init_adapter,
                "resume": self.resume, "variant": self.variant, "run_dir": self.run_dir,
                "register": self.register, "kl_text": self.kl_text}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TrainRequest:
        known = {"name", "base", "data", "settings", "init_adapter", "resume", "variant",
                 "run_dir", "register", "kl_text"}
        if not isinstance(data, dict) or set(data) - known:
            raise UsageError("malformed training request")
        return TrainRequest(**data)


@dataclass(frozen=True)
class Prepared:
    request: TrainRequest
    config: TrainConfig
    base_record: dict[str, Any]
    init_record: dict[str, Any] | None
    run_dir: Path


def prepare(catalog: Catalog, request: TrainRequest) -> Prepared:
    """Check a request against the catalog and resolve its configuration."""
    paths.check_name(request.name, "adapter name")
    if request.register:
        catalog.check_free(request.name)
        if signature_policy(catalog) == "require":
            # Refused before hours of training: the new adapter would arrive unsigned.
            raise RefusedError("the signature policy is require and a newly trained adapter "
                               "is unsigned: `policy set warn`, train, `sign` it, then "
                               "`policy set require` again")
    if request.variant:
        paths.check_name(request.variant, "variant name")
        if not request.register:
            raise UsageError("a variant needs the adapter in the catalog")
        if request.variant == request.name:
            raise UsageError("the variant needs a name of its own")
        catalog.check_free(request.variant)
    base = catalog.model(request.base)
    if base["backend"] != "llama" or base["format"] != "gguf":
        raise RefusedError(f"{request.base} is an {base['backend']} model; training goes "
                           "through a GGUF base served by llama.cpp")
    data_path = Path(request.data).expanduser()
    if not data_path.is_file():
        raise UsageError(f"data file {printable(str(data_path))} does not exist")
    init = None
    settings = dict(request.settings)
    targets = settings.get("targets")
    if targets is not None and not (targets.strip() if isinstance(targets, str) else targets):
        del settings["targets"]  # an empty targets field: the base family's default
    if request.init_adapter:
        init = catalog.adapter(request.init_adapter)
        if init["format"] != "gguf":
            raise RefusedError(f"{request.init_adapter} is a {init['format']} adapter; "
                               "continue a GGUF adapter")
        if init["base_sha256"] != base["sha256"]:
            raise RefusedError(f"{request.init_adapter} belongs to base {init['base']}, "
                               f"not {request.base}")
        meta = init["metadata"]
        rank, alpha = meta.get("rank"), meta.get("alpha")
        if not alpha and rank:
            # An adapter without alpha (absent or 0) is applied by llama.cpp at scale 1,
            # which is alpha = rank: continue it at that scale, not refuse it.
            alpha = float(rank)
        inherited = {"rank": rank, "alpha": alpha,
                     "targets": list(meta.get("targets") or [])}
        for key, value in inherited.items():
            if key in settings and _normal(key, settings[key]) != _normal(key, value):
                raise UsageError(f"--{key} {settings[key]} differs from the starting "
                                 f"adapter's {value}; leave it out to continue the adapter")
            settings[key] = value
    config = TrainConfig.from_dict(settings)
    model_path = Path(base["path"])
    if model_path.is_file():  # a missing file is the worker's verification to report
        # Refused up front, before any process starts, with the reason: a family, RoPE
        # or weight type the trainer cannot compute as llama.cpp does; a target the
        # family's layers do not have. Targets the user left out are the family's.
        from engine.training import support

        described = support.describe_path(model_path, config.numerics)
        if "targets" not in settings:
            config = replace(config, targets=support.default_targets(described))
        support.check_targets(described, config.targets)
    kl_text = None
    if request.kl_text:
        kl_path = Path(request.kl_text).expanduser()
        if not kl_path.is_file():
            raise UsageError(f"KL text {printable(str(kl_path))} does not exist")
        if not config.kl:
            raise UsageError("a KL text needs a KL weight (--kl WEIGHT) to be measured with")
        kl_text = str(kl_path.absolute())
    if request.resume:
        checkpoint = Path(request.resume).expanduser()
        if not checkpoint.is_file():
            raise UsageError(f"checkpoint {printable(str(checkpoint))} does not exist")
        run_dir = checkpoint.parent
    elif request.run_dir:
        run_dir = Path(request.run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        run_dir = paths.data_dir() / "training" / f"{request.name}-{stamp}"
    return Prepared(replace(request, data=str(data_path.absolute()), settings=settings,
                            kl_text=kl_text), config, base, init, run_dir)


def _normal(key: str, value: Any) -> Any:
    if key == "targets":
        from engine.formats import naming

        text = value if isinstance(value, str) else ",".join(value)
        return naming.parse_targets(text)
    return float(value)


# ---------------------------------------------------------------------------- the run


def check_inputs(catalog: Catalog, base: dict[str, Any], init: dict[str, Any] | None,
                 emit: Emit, cancelled: Callable[[], bool]
                 ) -> tuple[BaseModelInfo, lora_io.LoraWeights | None]:
    """In the worker, before anything is trained: the base file is still the recorded
    one and the starting adapter (if any) still checks; the base's inspection and the
    starting adapter's weights."""
    emit("stage", stage="verifying the base model")
    status = catalog.verify_base(base["name"], cancelled=cancelled)
    if not status.ok:
        raise RefusedError(f"base {base['name']}: {status.detail}")
    if init is None:
        return catalog.base_info(base), None
    report = health.recheck_adapter(catalog, init["name"])
    if not report.ok:
        raise RefusedError(f"starting adapter {init['name']}: {report.reason()}")
    return catalog.base_info(base), lora_io.read_gguf(Path(init["path"]))


def execute(request: TrainRequest, emit: Emit, cancelled: Callable[[], bool]) -> dict[str, Any]:
    """Train, write the adapter files and the record, and import them (worker side)."""
    catalog = Catalog()
    setup.first_run(catalog)
    prepared = prepare(catalog, request)
    request, config = prepared.request, prepared.config
    base = prepared.base_record
    started_at = now_iso()
    clock = time.monotonic()
    info, init_weights = check_inputs(catalog, base, prepared.init_record, emit, cancelled)
    model_path = Path(base["path"])
    init_sha = prepared.init_record["sha256"] if prepared.init_record is not None else None

    emit("stage", stage="reading the data")
    from engine.training.tokenizer import Tokenizer

    with Tokenizer(model_path, info) as tokenizer:
        data = data_mod.load(Path(request.data), tokenizer, config.seq_len, config.train_eot,
                             config.dpo, config.steps, config.batch)
        kl_text = None if request.kl_text is None else \
            data_mod.load_kl_text(Path(request.kl_text), tokenizer, config.seq_len)
    emit("data", **data.summary())
    for warning in data.warnings:
        emit("warning", message=warning)
    if cancelled():
        raise Cancelled("training cancelled before the first step")
    # Before anything is loaded: the run's peak memory, shown, and refused (with the
    # settings that would fit) when it exceeds what the machine has.
    estimated = check_memory(model_path, config, data, kl_text is not None, emit)

    if not torch_available():
        raise RefusedError(ENABLE_HINT)
    from engine.training import trainer as trainer_mod
    from engine.training.model import DecoderTorch

    trainer_mod.set_determinism(config.threads)
    emit("stage", stage="loading the base weights")
    shown = [-1]

    def loading(done: int, total: int) -> None:
        percent = done * 20 // total * 5
        if percent != shown[0]:
            shown[0] = percent
            emit("load", fraction=percent / 100)
        if cancelled():
            raise Cancelled("training cancelled while loading the base weights")

    model = DecoderTorch(model_path, loading, numerics=config.numerics)
    model.keep_products = bool(estimated["keep_products"])  # the same numbers either way
    trainer = trainer_mod.Trainer(model, config, data, base["sha256"], init_weights, init_sha,
                                  kl_text)
    run_dir = prepared.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = run_dir / CHECKPOINT_FILE
    resumed = None
    if request.resume:
        trainer.load_checkpoint(Path(request.resume))
        resumed = {"checkpoint": Path(request.resume).name, "step": trainer.step}
        emit("resumed", step=trainer.step, steps=config.steps)
    emit("stage", stage="training")
    train_clock = time.monotonic()
    try:
        trainer.run(emit, cancelled, checkpoint)
    except Cancelled:
        emit("stopped", step=trainer.step,
             checkpoint=str(checkpoint) if checkpoint.exists() else None)
        raise
    train_seconds = time.monotonic() - train_clock
    from engine.training import memory

    # The peak so far is training's (the served check below maps the file once more).
    used = {"estimate": estimated["total"], "peak_resident": memory.peak_resident(),
            "available": estimated["available"],
            "keep_products": estimated["keep_products"]}
    # The weights were read from the file we verified; make sure it has not changed since.
    if not catalog.verify_base(base["name"]).ok:
        raise RefusedError(f"base {base['name']} changed on disk during training")

    emit("stage", stage="writing the adapter")
    weights = trainer.weights(info.name)
    files = write_adapter_files(run_dir, weights, info.head_count, info.head_count_kv)
    checks = check_as_served(model_path, run_dir / ADAPTER_FILE, model, config.threads, emit,
                             cancelled)
    record = {
        **record_head(files, base, model_path, info.name),
        "data_sha256": data.sha256,
        "data": {**data.summary(), "path": str(Path(request.data))},
        "kl_text": None if kl_text is None else {**kl_text.summary(),
                                                 "path": str(Path(kl_text.path))},
        "seed": config.seed,
        "config": config.to_dict(),
        "init_adapter": None if prepared.init_record is None else {
            "name": prepared.init_record["name"], "sha256": init_sha,
            "source": prepared.init_record.get("source")},
        "resumed_from": resumed,
        "versions": provenance.versions(),
        "platform": provenance.platform_info(),
        "determinism": {"threads": config.threads, "deterministic_algorithms": True,
                        "env": {k: os.environ.get(k) for k in DETERMINISM_ENV}},
        "steps": trainer.step,
        "time": {"started": started_at, "finished": now_iso(),
                 "train_seconds": round(train_seconds, 3),
                 "total_seconds": round(time.monotonic() - clock, 3)},
        "memory": used,
        "loss": provenance.loss_summary(trainer.losses),
        "method": "dpo" if config.dpo else "sft",
        "served_checks": checks,
        "trainer": "variant-studio: LoRA through the GGUF file's own quantized tensors, "
                   "dequantized in memory; tokens from llama.cpp",
    }
    write_json_atomic(run_dir / PROVENANCE_FILE, record)
    write_json_atomic(run_dir / PEFT_DIR / PROVENANCE_FILE, record)
    result: dict[str, Any] = {"adapter": None, "variant": None, "run_dir": str(run_dir),
                              "files": files, "provenance": record, "checks": checks,
                              "system_prompt": data.system_prompt}
    if request.register:
        emit("stage", stage="importing into the catalog")
        result.update(import_run(catalog, request.name, base["name"], run_dir, record, files,
                                 request.variant, data.system_prompt))
    return result


def check_memory(model_path: Path, config: TrainConfig, data: data_mod.DataSet | None,
                 kl_text: bool, emit: Emit) -> dict[str, Any]:
    """The run's estimated peak memory against what is available (engine.training.memory),
    announced as a `memory` event; a RefusedError, with the estimate and the settings that
    would fit, when the run does not fit. `data`: its longest sequence bounds the estimate."""
    from engine.formats import gguf_file
    from engine.training import memory, support

    header = gguf_file.read_header(model_path)
    longest = None
    if data is not None and data.examples:
        longest = max(len(s.tokens) for e in data.examples for s in e.sequences)
    report = memory.report(header, support.describe(header), config, longest, kl_text)
    emit("memory", **report)  # shown also when it is refused
    if report["refusal"]:
        raise RefusedError(report["refusal"])
    return report


def check_as_served(model_path: Path, adapter: Path, model: Any, threads: int, emit: Emit,
                    cancelled: Callable[[], bool]) -> dict[str, Any]:
    """Measure the written adapter as llama.cpp serves it (parity with the trainer, drift
    on unrelated text: `engine.training.served_check`), announced as a `checks` event."""
    if cancelled():
        raise Cancelled("training cancelled before the served check")
    emit("stage", stage="checking the adapter as served (parity and drift)")
    from engine.training import served_check

    checks = served_check.measure(model_path, adapter, model, threads)
    emit("checks", **checks)
    return checks


def import_run(catalog: Catalog, name: str, base: str, run_dir: Path, record: dict[str, Any],
               files: dict[str, Any], variant: str | None = None,
               system_prompt: str | None = None) -> dict[str, Any]:
    """Import a run's adapter (strictly, with its record), its OpenVINO file when the
    base has a counterpart, and optionally a variant; the result's catalog part. The
    SFT/DPO run and the reinforcement loop (engine.training.rl) both end here.

    The adapter record carries the run's served-check verdict (`served_check`: passed,
    and the reason when not): an adapter whose check failed, or could not be measured,
    is imported marked, never as a silent success.
    """
    from engine.training import served_check

    adapter = imports.add_adapter(catalog, name, base, run_dir / ADAPTER_FILE,
                                  source=f"trained by variant-studio (run {run_dir.name})",
                                  strict=True, provenance=record,
                                  extra={"served_check": served_check.verdict(
                                      record.get("served_checks"))})
    out: dict[str, Any] = {"adapter": adapter["name"], "served_check": adapter["served_check"],
                           "openvino": attach_openvino(catalog, name, base, files)}
    if variant:
        profile = {"system_prompt": system_prompt} if system_prompt else None
        catalog.add_variant(variant, base, [AdapterSpec(name, 1.0)], profile)
        out["variant"] = variant
    return out


def attach_openvino(catalog: Catalog, name: str, base: str, files: dict[str, Any]
                    ) -> dict[str, Any]:
    """Give the new adapter its OpenVINO file when the base has an OpenVINO counterpart.

    The catalog converts the stored GGUF (declaring the counterpart's digest); its
    tensors are the run's PEFT export byte for byte, which the result reports.
    """
    counterpart = resolve.counterpart(catalog, base, "openvino")
    if counterpart is None:
        return {"attached": False, "peft_export": files["peft"]["file"],
                "reason": f"no OpenVINO counterpart of {base} in the catalog yet; "
                          f"`variant-studio adapter convert {name}` attaches one later"}
    entry = imports.convert_adapter(catalog, name, "openvino", counterpart)
    return {"attached": True, "base": counterpart, "sha256": entry["sha256"],
            "same_tensors_as_export": entry["sha256"] == files["peft"]["sha256"]}


def record_head(files: dict[str, Any], base: dict[str, Any], model_path: Path,
                model_name: str) -> dict[str, Any]:
    """What every run's provenance record begins with: the adapter files and the base."""
    return {
        "format": provenance.FORMAT,
        "adapter_sha256": files["gguf"]["sha256"],
        "adapter_files": files,
        "base_sha256": base["sha256"],
        "base": {"name": base["name"], "file": model_path.name, "model_name": model_name,
                 "sha256": base["sha256"]},
    }


def write_adapter_files(run_dir: Path, weights: lora_io.LoraWeights, n_head: int,
                        n_head_kv: int) -> dict[str, Any]:
    """The GGUF adapter (llama.cpp order) and its PEFT export (Hugging Face order)."""
    target = run_dir / ADAPTER_FILE
    tmp = run_dir / f".{ADAPTER_FILE}.tmp"
    lora_io.write_gguf(tmp, weights)
    os.replace(tmp, target)
    peft_dir = run_dir / PEFT_DIR
    peft_weights = lora_io.write_peft(peft_dir, lora_io.gguf_to_peft(weights, n_head,
                                                                      n_head_kv))
    return {
        "gguf": {"file": ADAPTER_FILE, "sha256": digest.hash_uncached(target)[0],
                 "size": target.stat().st_size},
        "peft": {"file": f"{PEFT_DIR}/{peft_weights.name}",
                 "sha256": digest.hash_uncached(peft_weights)[0],
                 "config_sha256": digest.hash_uncached(peft_dir / "adapter_config.json")[0],
                 "size": peft_weights.stat().st_size},
    }
