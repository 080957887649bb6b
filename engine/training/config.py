"""What a training run is: its configuration, checked, as a frozen value.

A `TrainConfig` crosses the process boundary as a plain dict and is recorded in full
in the adapter's provenance record; the same config, data, base and code write the
same adapter bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from engine.errors import UsageError
from engine.formats import naming

# A config built without targets adapts q and v; a training request without them gets
# its base family's default instead (job.prepare: `support.default_targets`, Phi-3's
# fused attn_qkv), which is the same pair for every family with separate q and v.
DEFAULT_TARGETS = ("attn_q", "attn_v")
# "served": the forward pass rounds where llama.cpp does (engine.training.served_math);
# "float": float32 activations, the only arithmetic before December 2026. A provenance record
# without the setting was trained with "float" (RECORD_DEFAULTS).
NUMERICS = ("served", "float")
# What a provenance record without a setting was trained with: records from before the
# setting existed.
RECORD_DEFAULTS: dict[str, Any] = {"numerics": "float", "kl": 0.0, "kl_batch": 2}
# Pinned so that the numbers do not depend on which CPU runs them: PyTorch's own
# kernels use their AVX2 code; MKL (PyTorch's matrix products) its COMPATIBLE branch,
# the one MKL documents as giving the same results on Intel and non-Intel CPUs (its
# AVX2 branch exists only on Intel: on AMD MKL silently uses its own dispatch, and an
# adapter trained on an Intel Xeon came out with other bytes on an AMD EPYC); fixed
# thread counts (no dynamic adjustment). Recorded in every provenance record.
DETERMINISM_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE",
                   "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}


@dataclass(frozen=True)
class TrainConfig:
    """Every setting that changes the adapter's bytes (plus `save_every`, which does not)."""

    targets: tuple[str, ...] = DEFAULT_TARGETS
    rank: int = 8
    alpha: float = 16.0
    lr: float = 1e-3
    steps: int = 100
    batch: int = 4
    seq_len: int = 256
    seed: int = 0
    train_eot: bool = False
    dpo: bool = False
    dpo_beta: float = 0.1
    warmup: int = -1  # -1: min(10, steps // 10)
    grad_clip: float = 1.0
    threads: int = 2
    save_every: int = 0  # 0: no intermediate checkpoints
    numerics: str = "served"
    # Weight of the KL penalty toward the base (adapter off) on the next-token
    # distributions at every prompt position (supervised runs), or, when the run has a
    # KL text, at every position of `kl_batch` of its passages per step; 0 switches it off.
    kl: float = 0.0
    kl_batch: int = 2

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise UsageError(message)

        check(isinstance(self.targets, tuple) and len(self.targets) > 0,
              "targets: give at least one (q, k, v, o, gate, up, down)")
        for target in self.targets:
            check(target in naming.PROJECTION_ROLES, f"unknown target {target!r}")
        check(len(set(self.targets)) == len(self.targets), "targets are listed twice")
        _int(self.rank, "rank", 1, 256)
        _num(self.alpha, "alpha", 1e-6, 1e6)
        _num(self.lr, "learning rate", 1e-9, 1.0)
        _int(self.steps, "steps", 1, 1_000_000)
        _int(self.batch, "batch", 1, 4096)
        _int(self.seq_len, "seq-len", 8, 32768)
        _int(self.seed, "seed", 0, 2**32 - 1)
        _num(self.dpo_beta, "dpo-beta", 1e-6, 1e3)
        _int(self.warmup, "warmup", -1, 1_000_000)
        _num(self.grad_clip, "grad-clip", 0.0, 1e6, allow_zero=True)
        _int(self.threads, "threads", 1, 1024)
        _int(self.save_every, "save-every", 0, 1_000_000)
        check(isinstance(self.train_eot, bool) and isinstance(self.dpo, bool),
              "train_eot and dpo are true or false")
        _num(self.kl, "kl", 0.0, 1e3, allow_zero=True)
        _int(self.kl_batch, "kl-batch", 1, 4096)
        check(not (self.dpo and self.kl), "kl is for supervised runs (DPO has its own "
              "reference in dpo-beta)")
        check(self.numerics in NUMERICS,
              f"numerics must be one of {', '.join(NUMERICS)}, got {self.numerics!r}")

    @property
    def warmup_steps(self) -> int:
        return min(10, self.steps // 10) if self.warmup < 0 else min(self.warmup, self.steps)

    @property
    def scale(self) -> float:
        """LoRA multiplier, as llama.cpp and PEFT apply it: alpha / rank."""
        return self.alpha / self.rank

    def lr_at(self, step: int) -> float:
        """Learning rate for `step` (0-based): linear warm-up, then linear decay to 0."""
        warm = self.warmup_steps
        if step < warm:
            return self.lr * (step + 1) / (warm + 1)
        remaining = self.steps - warm
        return self.lr * max(0.0, (self.steps - step) / max(remaining, 1))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["targets"] = list(self.targets)
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(TrainConfig)}
        unknown = set(data) - known
        if unknown:
            raise UsageError(f"unknown training settings: {', '.join(sorted(unknown))}")
        values = dict(data)
        if "targets" in values:
            targets = values["targets"]
            if not isinstance(targets, str):
                targets = ",".join(str(t) for t in targets)
            try:
                values["targets"] = naming.parse_targets(targets)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        return TrainConfig(**values)

    @staticmethod
    def from_record(config: dict[str, Any]) -> TrainConfig:
        """The configuration a provenance record (or checkpoint) holds."""
        return TrainConfig.from_dict(record_settings(config))

    def output_affecting(self) -> dict[str, Any]:
        """The settings a resumed run must share with its checkpoint."""
        out = self.to_dict()
        out.pop("save_every")
        return out


def _int(value: Any, name: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{name} must be a whole number from {low} to {high}, got {value!r}")


def _num(value: Any, name: str, low: float, high: float, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number, got {value!r}")
    if not (low <= value <= high or (allow_zero and value == 0)):
        raise UsageError(f"{name} must be between {low:g} and {high:g}, got {value!r}")


def record_settings(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded `config` as settings that retrain it: records written before the
    numerics setting existed were trained with float activations, before the KL
    setting with none (and so the KL batch never applied)."""
    return {**RECORD_DEFAULTS, **config}
