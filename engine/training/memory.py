"""How much memory a training run needs at its peak, said before it loads: torch-free.

The trainer (engine.training.model) keeps the base in the memory-mapped GGUF and
dequantizes each matrix just in time, checkpoints every decoder layer, and multiplies the
output matrix in row slices. So a run's peak is, in bytes:

- the runtime: Python, PyTorch, numpy and llama.cpp's libraries, the data
  (`RUNTIME_BYTES`, measured);
- the file's tensors, as their pages are mapped (every one is read at every step);
- the LoRA parameters, their gradients, Adam's two moments and the update's temporaries;
- the layer checkpoints: one (tokens x n_embd) float32 tensor per layer for every forward
  pass of a step that has gradients (the batch; DPO's two answers; the KL text's passages);
- with `keep_products`, the outputs of every layer's products with the frozen matrices
  (selective checkpointing: the recomputation then skips them, which makes the backward
  pass about 1.5x faster; engine.training.model);
- the larger of two working sets, which never coexist: one layer recomputed and
  back-propagated (its activations, per token and per attention score, and two of its
  matrices dequantized) or the output (the logits at every scored position, their
  log-softmax and gradients, and two dequantized slices of the output matrix; with a
  sliced output matrix the targets are scored in chunks of positions, so one chunk's).

The per-token and per-position factors (`ACTIVATION_FACTOR`, `ATTENTION_FACTOR`,
`LOGIT_COPIES`) are measured, not derived: autograd's saved tensors per layer plus the
backward pass's temporaries, against the peak resident set of real runs
(benchmarks/bench_train_memory.py compares estimate and measurement for every size;
docs/performance.md has the table). The estimate uses the settings' sequence length, or
the longest sequence of the data when that is shorter.

`report` compares the estimate with the memory available (MemAvailable from
/proc/meminfo, less nothing: the file's pages count as needed even when the page cache
already holds them; or `VARIANT_STUDIO_TRAIN_MEMORY`, a cap in GiB the user sets) and
refuses a run that does not fit even recomputing everything, naming the estimate, what is
available and the settings that would fit. It keeps the products' outputs when the run
then still needs at most `KEEP_SHARE` of that memory: the same numbers either way, so the
choice is the machine's, not the run's (it is not recorded as a setting).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import RefusedError
from engine.formats.architecture import Model
from engine.training.config import TrainConfig

GIB = 1 << 30
MIB = 1 << 20
# Python, PyTorch (about 220 MB resident after import), numpy, llama.cpp's libraries and
# the worker's own objects; measured on the embedded model's runs (docs/performance.md).
RUNTIME_BYTES = 420 * MIB
# float32 values autograd keeps per token of a layer, per unit of the layer's widths
# (2 n_embd + 2 q + 2 kv + 3 n_ff), and the backward pass's gradients beside them.
ACTIVATION_FACTOR = 3.0
# float32 values per attention score (batch x heads x seq x keys): scores, masked scores,
# probabilities (and their fp16 copy in served numerics), and their gradients.
ATTENTION_FACTOR = 5.0
# float32 copies of (positions x vocabulary): the slices' products and their
# concatenation, the log-softmax kept for the backward pass, its gradient.
LOGIT_COPIES = 4.0
# Parameters, gradients, Adam's moments, the update's temporaries (g * clip, the denominator).
LORA_COPIES = 6
# The trainer (engine.training.model) multiplies the output matrix (vocabulary x n_embd)
# in row slices of at most this much float32: an 8B model's is 2.1 GB dequantized. The
# embedded model's (113 MB) is one slice, so its logits are the very same product as
# before slicing existed.
OUTPUT_SLICE_BYTES = 128 * MIB
# With a sliced output, the targets' log-probabilities are computed in checkpointed
# chunks of positions whose float32 logits are at most this many bytes
# (`DecoderTorch.target_logps`): one chunk's logits, log-softmax and gradient at a time,
# not four copies for every position (a 128k vocabulary at seq-len 256: 131 MB a copy).
# A one-slice output (the embedded model: the demo's sha256) is scored whole, as before.
LOGIT_CHUNK_BYTES = 64 * MIB
MEMORY_ENV = "VARIANT_STUDIO_TRAIN_MEMORY"
# Allocations over this size get their own mapping (`give_freed_memory_back`).
HEAP_LIMIT_BYTES = 1 * MIB
M_MMAP_THRESHOLD = -3  # glibc's malloc.h
# Keep the products' outputs when the run then needs at most this share of the memory
# available (the rest is the machine's, and the estimate's margin).
KEEP_SHARE = 0.75


@dataclass(frozen=True)
class Estimate:
    """A run's estimated peak memory, in bytes, and what it is made of."""

    total: int
    parts: dict[str, int]
    batch: int
    seq_len: int
    keep_products: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "parts": dict(self.parts), "batch": self.batch,
                "seq_len": self.seq_len, "keep_products": self.keep_products}


def gib(value: float) -> str:
    """Bytes in words: "3.4 GB", or "640 MB" under a gigabyte (binary units)."""
    return f"{value / GIB:.1f} GB" if value >= GIB else f"{value / MIB:.0f} MB"


def _matrix(header: Any, name: str) -> tuple[int, int]:
    shape = header.tensors[name].shape  # ggml order: columns first
    return int(shape[1]), int(shape[0])


def estimate(header: Any, model: Model, config: TrainConfig, seq_len: int | None = None,
             kl_text: bool = False, keep_products: bool = False) -> Estimate:
    """The peak of a run of `config` on the file of `header` (described as `model`);
    `seq_len`: the longest sequence the run will see (default: the config's);
    `keep_products`: the layers keep their products' outputs (selective checkpointing)."""
    seq = min(config.seq_len, seq_len or config.seq_len)
    batch = config.batch
    used = set(model.required_tensors())
    file_bytes = sum(info.nbytes for name, info in header.tensors.items() if name in used)
    output = "token_embd.weight" if model.tied_output else "output.weight"
    vocab, n_embd = _matrix(header, output)
    matrices = [_matrix(header, n) for n in used
                if n.startswith("blk.") and len(header.tensors[n].shape) == 2]
    largest = max((r * c for r, c in matrices), default=0)
    lora = 0
    for role in config.targets:  # GGUF roles (attn_q, ...), as the config holds them
        rows, columns = _matrix(header, model.tensor(0, role))
        lora += config.rank * (rows + columns)
    lora *= model.n_layer * 4 * LORA_COPIES
    # Rows of one forward pass with gradients, and the step's passes with gradients.
    rows = 2 * batch if config.dpo else batch
    passes = rows * seq + (config.kl_batch * seq if kl_text and config.kl else 0)
    checkpoints = model.n_layer * passes * n_embd * 4
    widths = 2 * n_embd + 2 * model.q_width + 2 * model.kv_width + 3 * model.n_ff
    layer = int(ACTIVATION_FACTOR * rows * seq * widths * 4
                + ATTENTION_FACTOR * rows * model.n_head * seq * seq * 4
                + 2 * largest * 4)
    # Scored positions: the targets, at most every position; the KL penalty scores every
    # position too (the base's distributions kept beside the adapted ones).
    positions = rows * seq
    if vocab * n_embd * 4 > OUTPUT_SLICE_BYTES:
        # A sliced output: the targets are scored in checkpointed chunks of positions
        # (engine.training.model.target_logps), one chunk's logits at a time.
        positions = min(positions, max(1, LOGIT_CHUNK_BYTES // (4 * vocab)))
    copies = LOGIT_COPIES + (2 if config.kl else 0)
    if kl_text and config.kl:
        positions += config.kl_batch * seq
    logits = int(copies * positions * vocab * 4
                 + 2 * min(OUTPUT_SLICE_BYTES, vocab * n_embd * 4))
    # The products' outputs: q, k, v (or qkv), o, gate and up (or Phi-3's gate|up), down.
    products = (model.n_layer * passes * 4
                * (model.q_width + 2 * model.kv_width + 2 * n_embd + 2 * model.n_ff)
                if keep_products else 0)
    parts = {"runtime": RUNTIME_BYTES, "file": file_bytes, "lora": lora,
             "checkpoints": checkpoints, "products": products, "layer": layer,
             "logits": logits}
    total = RUNTIME_BYTES + file_bytes + lora + checkpoints + products + max(layer, logits)
    return Estimate(total, parts, batch, seq, keep_products)


def give_freed_memory_back() -> None:
    """Serve every allocation over `HEAP_LIMIT_BYTES` from a mapping of its own, which is
    returned to the system when freed (glibc's mallopt M_MMAP_THRESHOLD; elsewhere,
    nothing). By default glibc raises that threshold up to 32 MB as large blocks are
    freed, so a step's many activation tensors of a few MB came from the heap, which kept
    about 1 GB of freed, fragmented memory: a 1B-shape step peaked at 2.26 GiB resident,
    1.51 GiB with this (docs/performance.md). Called by the training worker before the
    model loads."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, HEAP_LIMIT_BYTES)


def available(env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """(bytes a run may use, where that figure comes from)."""
    env = os.environ if env is None else env
    cap = env.get(MEMORY_ENV)
    if cap:
        try:
            return int(float(cap) * GIB), f"{MEMORY_ENV}={cap}"
        except ValueError:
            pass
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    return None, "unknown"


def resident() -> int:
    """This process's resident set now (bytes; 0 where /proc is not there)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def peak_resident() -> int:
    """This process's peak resident set so far (VmHWM, bytes; 0 where not known)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def fitting(header: Any, model: Model, config: TrainConfig, budget: int,
            seq_len: int | None = None, kl_text: bool = False) -> TrainConfig | None:
    """The settings nearest to `config` whose estimate fits in `budget`: the same
    sequence length with a smaller batch, else batch 1 with a shorter sequence length
    (halved, down to 64); None when not even that fits."""
    seq = min(config.seq_len, seq_len or config.seq_len)
    for batch in range(config.batch, 0, -1):
        trial = replace(config, batch=batch, seq_len=seq)
        if estimate(header, model, trial, seq, kl_text).total <= budget:
            return trial
    length = seq // 2
    while length >= 64:
        trial = replace(config, batch=1, seq_len=length)
        if estimate(header, model, trial, length, kl_text).total <= budget:
            return trial
        length //= 2
    return None


def report(header: Any, model: Model, config: TrainConfig, seq_len: int | None = None,
           kl_text: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The estimate against what is available (the worker's `memory` event): `total`,
    `parts`, `batch`, `seq_len`, `available` and its `available_source`, `resident`, and
    `refusal`: None when the run fits, else why not and the settings that would fit. What
    this process already holds counts as part of the estimate, not as used memory."""
    found = estimate(header, model, config, seq_len, kl_text)
    free, source = available(env)
    held = resident()
    info: dict[str, Any] = {**found.to_dict(), "available": free, "available_source": source,
                            "resident": held, "refusal": None, "lean_total": found.total}
    if free is None:
        return info
    budget = free + (held if source == "MemAvailable" else 0)
    if found.total <= budget:
        kept = estimate(header, model, config, seq_len, kl_text, keep_products=True)
        if kept.total <= KEEP_SHARE * budget:
            info.update(kept.to_dict())
        return info
    big = ", ".join(f"{k} {gib(v)}" for k, v in found.parts.items()
                    if k in ("file", "checkpoints", "layer", "logits", "lora"))
    what = (f"this run needs about {gib(found.total)} of memory at its peak (batch "
            f"{found.batch}, seq-len {found.seq_len}: {big}), and {gib(budget)} is "
            f"available ({source})")
    fits = fitting(header, model, config, budget, seq_len, kl_text)
    if fits is None:
        info["refusal"] = (f"{what}; no batch or sequence length fits: the file and the "
                           f"runtime alone need {gib(found.parts['file'] + RUNTIME_BYTES)}")
    else:
        smaller = estimate(header, model, fits, fits.seq_len, kl_text).total
        flags = f"--batch {fits.batch}" + (f" --seq-len {fits.seq_len}"
                                             if fits.seq_len != found.seq_len else "")
        info["refusal"] = f"{what}; {flags} would fit (about {gib(smaller)})"
    return info


def check(header: Any, model: Model, config: TrainConfig, seq_len: int | None = None,
          kl_text: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`report`, or a RefusedError with its reason when the run does not fit."""
    found = report(header, model, config, seq_len, kl_text, env)
    if found["refusal"]:
        raise RefusedError(found["refusal"])
    return found


def summary(event: dict[str, Any]) -> str:
    """The worker's `memory` event (`check`'s report) in words, for the CLI and the Train
    page: the estimated peak, its largest parts and what the machine has."""
    parts = event.get("parts") or {}
    shown = ", ".join(f"{name} {gib(parts[name])}"
                      for name in ("file", "layer", "logits", "checkpoints", "products")
                      if parts.get(name))
    free = event.get("available")
    have = (f"{gib(free)} available ({event.get('available_source')})" if free is not None
            else "available memory unknown")
    mode = ("keeping the products' outputs" if event.get("keep_products")
            else "recomputing each layer whole")
    return (f"about {gib(event['total'])} at the peak for batch {event['batch']} × seq-len "
            f"{event['seq_len']}, {mode} ({shown}); {have}")
