"""The training loop: LoRA on the frozen, dequantized GGUF weights, reproducibly.

Torch-only: run inside the training worker process.

Reproducibility: the LoRA initialisation comes from a generator seeded with the
config's seed; the example order of every epoch is a numpy permutation seeded with
(seed, epoch); the thread count is fixed by the config; PyTorch runs with
deterministic algorithms; the optimiser (Adam, written out here so its state is
plain tensors) and the learning-rate schedule depend only on the step. So the same
data, config, base and code give the same adapter bytes, and a run resumed from a
checkpoint ends exactly where an uninterrupted one does.

Loss: supervised runs minimise sum(weight * NLL of each target token) / (number of
target tokens in the batch); a negative weight pushes an example's likelihood down.
DPO runs minimise -weight * log sigmoid(beta * ((log pi(chosen) - log ref(chosen)) -
(log pi(rejected) - log ref(rejected)))), averaged over the pairs, where the reference
is the same model with the adapter switched off, so no second copy is needed.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import Cancelled, RefusedError
from engine.formats import lora_io
from engine.training import support
from engine.training.config import TrainConfig, record_settings
from engine.training.data import DataSet, KlText, Sequence
from engine.training.model import DecoderTorch

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
CHECKPOINT_FORMAT = "variant-studio-lora-checkpoint/1"
MIN_SHARED_PREFIX = 8
Emit = Callable[..., None]


def set_determinism(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def shared_prefix(sequences: list[Sequence]) -> int:
    """Length of the prefix every sequence shares and no target falls in (or after
    whose last position a target is predicted)."""
    first = sequences[0].tokens
    length = min(len(s.tokens) for s in sequences)
    for seq in sequences[1:]:
        n = 0
        while n < length and seq.tokens[n] == first[n]:
            n += 1
        length = n
    for seq in sequences:
        first_target = next(t for t, trained in enumerate(seq.targets) if trained)
        length = min(length, first_target - 1)
    return max(length, 0)


class Trainer:
    """Owns the LoRA parameters, the optimiser state and the step counter."""

    def __init__(self, model: DecoderTorch, config: TrainConfig, data: DataSet,
                 base_sha256: str, init: lora_io.LoraWeights | None = None,
                 init_sha256: str | None = None, kl_text: KlText | None = None) -> None:
        self.model = model
        self.config = config
        self.data = data
        self.kl_text = kl_text
        self.base_sha256 = base_sha256
        self.init_sha256 = init_sha256
        self.step = 0
        self.losses: list[float] = []
        self._perms: dict[tuple[int, int], np.ndarray] = {}
        self._reference: dict[int, tuple[float, float]] = {}
        # Layer by layer, each in the config's target order: the order A is drawn in.
        support.check_targets(model.arch, config.targets)
        self.modules = [model.module(i, role)
                        for i in range(model.arch.n_layer) for role in config.targets]
        generator = torch.Generator().manual_seed(config.seed)
        for module in self.modules:
            out_f, in_f = model.shape_of(module)
            if init is not None:
                if module not in init.layers:
                    raise RefusedError(f"the starting adapter has no {module}")
                a_np, b_np = init.layers[module]
                if a_np.shape != (config.rank, in_f) or b_np.shape != (out_f, config.rank):
                    raise RefusedError(f"the starting adapter's {module} has shapes "
                                       f"{a_np.shape} / {b_np.shape}, expected "
                                       f"{(config.rank, in_f)} / {(out_f, config.rank)}")
                a = torch.from_numpy(np.array(a_np, dtype=np.float32))
                b = torch.from_numpy(np.array(b_np, dtype=np.float32))
            else:
                # PEFT's default: A uniform in +-1/sqrt(in) (kaiming, a=sqrt(5)), B zero.
                bound = 1.0 / math.sqrt(in_f)
                a = (torch.rand(config.rank, in_f, generator=generator) * 2 - 1) * bound
                b = torch.zeros(out_f, config.rank)
            model.add_lora(module, a, b)
        if init is not None:
            extra = set(init.layers) - set(self.modules)
            if extra:
                raise RefusedError(f"the starting adapter also adapts {sorted(extra)[0]}; "
                                   "train the same targets it has")
        model.set_lora_scale(config.scale)
        self.params = [p for _, p in sorted(model.loras.named_parameters())]
        self.names = [n for n, _ in sorted(model.loras.named_parameters())]
        self.adam_m = [torch.zeros_like(p) for p in self.params]
        self.adam_v = [torch.zeros_like(p) for p in self.params]

    # ------------------------------------------------------------------ batches

    def batch_indices(self, step: int) -> list[int]:
        """The examples of `step`'s batch."""
        return self._draw(step, len(self.data.examples), self.config.batch, stream=0)

    def kl_passages(self, step: int) -> list[tuple[int, ...]]:
        """The KL text's passages for `step`, drawn in a stream of their own, so adding a
        KL text leaves the examples' batches as they were."""
        assert self.kl_text is not None
        passages = self.kl_text.passages
        return [passages[i] for i in self._draw(step, len(passages), self.config.kl_batch,
                                                stream=1)]

    def _draw(self, step: int, n: int, per_step: int, stream: int) -> list[int]:
        """`per_step` indices into `n` items for `step`: epochs of a permutation seeded
        with (seed, epoch) for the examples (stream 0), (seed, stream, epoch) otherwise."""
        out = []
        for j in range(per_step):
            epoch, position = divmod(step * per_step + j, n)
            key = (stream, epoch)
            if key not in self._perms:
                seed = [self.config.seed, epoch] if stream == 0 else \
                    [self.config.seed, stream, epoch]
                self._perms[key] = np.random.default_rng(seed).permutation(n)
            out.append(int(self._perms[key][position]))
        return out

    # ------------------------------------------------------------------ scoring

    @contextmanager
    def scoring(self, adapter: bool = False) -> Iterator[None]:
        """Score without gradients, with the adapter on, or off: the base, which is the
        reference of DPO, of the KL penalty and of the RL loop (no second copy)."""
        self.model.lora_enabled = adapter
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.lora_enabled = True

    def target_logps(self, sequences: list[Sequence]) -> list[torch.Tensor]:
        """Per sequence: the log-probabilities of its target tokens, with the adapter as
        it is now (the RL loop scores rollouts with it)."""
        return self._target_logps(sequences)

    def _target_logps(self, sequences: list[Sequence]) -> list[torch.Tensor]:
        """Per sequence: the log-probabilities of its target tokens (in order)."""
        return self._forward(sequences, anchors=False)[0]

    def _forward(self, sequences: list[Sequence], anchors: bool
                 ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Per sequence, the log-probabilities of its target tokens (in order); with
        `anchors`, also the next-token log-distributions (positions, vocab) at every
        position that predicts a token that is not a target (the prompt's), for the KL
        penalty toward the base.

        Sequences that share a prefix (a system prompt, DPO's common prompt) compute it
        once: its keys and values are shared by every row of the batch, and its anchor
        positions count once.
        """
        prefix = shared_prefix(sequences) if len(sequences) > 1 else 0
        if prefix < MIN_SHARED_PREFIX:
            prefix = 0
        length = max(len(s.tokens) for s in sequences) - prefix
        ids = torch.zeros(len(sequences), length, dtype=torch.long)
        rows, cols, targets, sizes = [], [], [], []
        anchor_rows, anchor_cols = [], []
        for i, seq in enumerate(sequences):
            ids[i, :len(seq.tokens) - prefix] = torch.tensor(seq.tokens[prefix:],
                                                             dtype=torch.long)
            count = 0
            for t, trained in enumerate(seq.targets):
                if trained:
                    rows.append(i)
                    cols.append(t - 1 - prefix)
                    targets.append(seq.tokens[t])
                    count += 1
                elif t > prefix:
                    anchor_rows.append(i)
                    anchor_cols.append(t - 1 - prefix)
            sizes.append(count)
        past, head = None, None
        if prefix:
            first = torch.tensor([sequences[0].tokens[:prefix]], dtype=torch.long)
            head, past = self.model.hidden(first, keep=True)
        hidden = self.model.hidden(ids, past)[0]
        picked = hidden[torch.tensor(rows), torch.tensor(cols)]
        chosen = self.model.target_logps(picked, torch.tensor(targets))
        spread = None
        if anchors:
            parts = [hidden[torch.tensor(anchor_rows, dtype=torch.long),
                            torch.tensor(anchor_cols, dtype=torch.long)]]
            if head is not None:
                parts.insert(0, head[0])
            spread = torch.log_softmax(self.model.logits(torch.cat(parts)), dim=-1)
        return list(torch.split(chosen, sizes)), spread

    def _distributions(self, passages: list[tuple[int, ...]]) -> torch.Tensor:
        """Next-token log-distributions at every position of `passages` that predicts a
        token of its own (positions, vocab), in order."""
        ids = torch.zeros(len(passages), max(len(p) for p in passages), dtype=torch.long)
        rows, cols = [], []
        for i, passage in enumerate(passages):
            ids[i, :len(passage)] = torch.tensor(passage, dtype=torch.long)
            rows += [i] * (len(passage) - 1)
            cols += range(len(passage) - 1)
        hidden = self.model.hidden(ids)[0]
        picked = hidden[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)]
        return torch.log_softmax(self.model.logits(picked), dim=-1)

    def _sft_loss(self, batch: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        examples = [self.data.examples[i] for i in batch]
        sequences = [e.sequences[0] for e in examples]
        kl_weight = self.config.kl
        on_prompts = bool(kl_weight) and self.kl_text is None
        reference = spread = None
        if kl_weight and self.kl_text is not None:
            # On the KL text: the base and the adapted model on the same passages.
            # (Before the batch's forward pass, the order the shipped demo was trained
            # in: moving it could change the order gradients are summed in, and bytes.)
            passages = self.kl_passages(self.step)
            with self.scoring():
                reference = self._distributions(passages)
            spread = self._distributions(passages)
        elif on_prompts:
            # The base (adapter off) in this very batch: the same shapes and shared
            # prefix, so before the first update the penalty is exactly zero.
            with self.scoring():
                reference = self._forward(sequences, anchors=True)[1]
        logps, prompt_spread = self._forward(sequences, anchors=on_prompts)
        if on_prompts:
            spread = prompt_spread
        total = sum(int(x.numel()) for x in logps)
        weighted = torch.stack([x.sum() * e.weight for x, e in zip(logps, examples,
                                                                     strict=True)])
        loss = -weighted.sum() / total
        metrics = {"tokens": float(total)}
        if reference is not None and spread is not None and len(spread):
            # KL(base || adapted) of the next-token distributions at the prompt's (or
            # the KL text's) positions, averaged over them: the adapter is pulled back
            # wherever it changes what the model expects of text that is not an answer.
            kl = (reference.exp() * (reference - spread)).sum(-1).mean()
            loss = loss + kl_weight * kl
            metrics["kl"] = float(kl.detach())
            metrics["kl_positions"] = float(len(spread))
        return loss, metrics

    def _reference_logps(self, batch: list[int]) -> list[tuple[float, float]]:
        """Reference scores (adapter off), computed once per example on its own, so the
        value never depends on which batch the example first appeared in."""
        for i in dict.fromkeys(batch):
            if i in self._reference:
                continue
            with self.scoring():
                chosen, rejected = self._target_logps(list(self.data.examples[i].sequences))
            self._reference[i] = (float(chosen.sum()), float(rejected.sum()))
        return [self._reference[i] for i in batch]

    def _dpo_loss(self, batch: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        examples = [self.data.examples[i] for i in batch]
        sequences = [s for e in examples for s in e.sequences]
        if self.model.served:
            # Served numerics are chaotic: scoring the same pair in another batch (other
            # shapes, another shared prefix) moves its log-probabilities by ~0.03, which
            # would enter every margin as noise. Score the reference in this very batch,
            # so policy and reference differ only by the adapter (step 1 is log 2 exactly).
            with self.scoring():
                ref = [float(x.sum()) for x in self._target_logps(sequences)]
            reference = [(ref[2 * k], ref[2 * k + 1]) for k in range(len(examples))]
        else:
            reference = self._reference_logps(batch)
        sums = [x.sum() for x in self._target_logps(sequences)]
        beta = self.config.dpo_beta
        margins = torch.stack([
            beta * ((sums[2 * k] - ref_c) - (sums[2 * k + 1] - ref_r))
            for k, (ref_c, ref_r) in enumerate(reference)])
        weights = torch.tensor([e.weight for e in examples], dtype=torch.float32)
        loss = -(weights * torch.nn.functional.logsigmoid(margins)).sum() / len(examples)
        observed = margins.detach()
        return loss, {"reward_accuracy": float((observed > 0).float().mean()),
                      "reward_margin": float(observed.mean() / beta)}

    # ------------------------------------------------------------------ one step

    def train_step(self) -> dict[str, Any]:
        config = self.config
        batch = self.batch_indices(self.step)
        self.zero_grad()
        loss, metrics = (self._dpo_loss if config.dpo else self._sft_loss)(batch)
        value = self.backward(loss)
        return self.update(value, metrics)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def backward(self, loss: torch.Tensor) -> float:
        """Add `loss`'s gradients (several calls accumulate, as the RL loop's groups do);
        its value, refused when it is not finite."""
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RefusedError(f"training diverged at step {self.step + 1} (loss {value}); "
                               "lower the learning rate")
        loss.backward()
        return value

    def update(self, value: float, metrics: dict[str, float]) -> dict[str, Any]:
        """One optimiser step with the accumulated gradients (clipped, Adam); `value` is
        the step's loss, recorded in the history."""
        config = self.config
        lr = config.lr_at(self.step)
        with torch.no_grad():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p)
                     for p in self.params]
            norm = float(torch.sqrt(torch.stack([(g * g).sum() for g in grads]).sum()))
            clip = 1.0
            if config.grad_clip and norm > config.grad_clip:
                clip = config.grad_clip / (norm + 1e-6)
            b1, b2 = ADAM_BETAS
            t = self.step + 1
            for p, g, m, v in zip(self.params, grads, self.adam_m, self.adam_v, strict=True):
                g = g * clip
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v / (1 - b2 ** t)).sqrt_().add_(ADAM_EPS)
                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
        self.step += 1
        self.losses.append(value)
        return {"step": self.step, "loss": value, "lr": lr, "grad_norm": norm, **metrics}

    # ------------------------------------------------------------------ results

    def weights(self, base_name: str | None) -> lora_io.LoraWeights:
        """The adapter in llama.cpp's row order (q/k as the GGUF stores them)."""
        layers = {}
        for module in self.modules:
            lora = self.model.loras[self.model.key(module)]
            layers[module] = (lora.a.detach().numpy().copy(), lora.b.detach().numpy().copy())
        return lora_io.LoraWeights(float(self.config.alpha), self.config.rank, layers,
                                   self.model.arch.name, base_name, self.base_sha256)

    # ------------------------------------------------------------------ checkpoints

    def _meta(self) -> dict[str, str]:
        return {
            "format": CHECKPOINT_FORMAT,
            "step": str(self.step),
            "config": json.dumps(self.config.output_affecting(), sort_keys=True),
            "base_sha256": self.base_sha256,
            "data_sha256": self.data.sha256,
            "kl_text_sha256": self.kl_text.sha256 if self.kl_text is not None else "",
            "init_sha256": self.init_sha256 or "",
            "losses": json.dumps(self.losses),
        }

    def save_checkpoint(self, path: Path) -> None:
        """Write atomically: a crash or error mid-write keeps the previous checkpoint."""
        from safetensors.numpy import save

        tensors: dict[str, np.ndarray] = {}
        for name, p, m, v in zip(self.names, self.params, self.adam_m, self.adam_v,
                                 strict=True):
            tensors[f"param.{name}"] = p.detach().numpy().copy()
            tensors[f"adam_m.{name}"] = m.numpy().copy()
            tensors[f"adam_v.{name}"] = v.numpy().copy()
        blob = save(tensors, metadata=self._meta())
        _write_atomic(path, blob)

    def load_checkpoint(self, path: Path) -> None:
        from safetensors import safe_open

        from engine.formats import safetensors_file

        safetensors_file.read_header(path)  # strict structural checks first
        with safe_open(str(path), framework="numpy") as handle:
            meta = handle.metadata() or {}
            if meta.get("format") != CHECKPOINT_FORMAT:
                raise RefusedError(f"{path.name} is not a training checkpoint")
            mine = self._meta()
            for key, what in (("base_sha256", "base model"), ("data_sha256", "data"),
                              ("init_sha256", "starting adapter"),
                              ("kl_text_sha256", "KL text")):
                if meta.get(key, "") != mine[key]:
                    raise RefusedError(f"checkpoint {path.name} was made with a different "
                                       f"{what}; it cannot be resumed with this one")
            # A checkpoint from before the numerics setting was trained in float.
            recorded = record_settings(json.loads(meta.get("config", "{}")))
            if recorded != self.config.output_affecting():
                raise RefusedError(f"checkpoint {path.name} was made with different "
                                   "settings; resume with the same ones")
            step = int(meta["step"])
            losses = json.loads(meta["losses"])
            with torch.no_grad():
                for name, p, m, v in zip(self.names, self.params, self.adam_m, self.adam_v,
                                         strict=True):
                    for prefix, target in (("param", p), ("adam_m", m), ("adam_v", v)):
                        value = handle.get_tensor(f"{prefix}.{name}")
                        if value.shape != tuple(target.shape):
                            raise RefusedError(f"checkpoint {path.name}: {name} has the "
                                               "wrong shape")
                        target.copy_(torch.from_numpy(np.array(value, dtype=np.float32)))
        if not 0 < step <= self.config.steps or len(losses) != step:
            raise RefusedError(f"checkpoint {path.name} is inconsistent (step {step})")
        self.step = step
        self.losses = [float(x) for x in losses]

    # ------------------------------------------------------------------ the loop

    def run(self, emit: Emit, cancelled: Callable[[], bool],
            checkpoint: Path | None) -> None:
        def check() -> None:
            if cancelled():
                raise Cancelled(f"training cancelled at step {self.step}")

        self.model.check = check
        started = time.monotonic()
        first = self.step
        try:
            while self.step < self.config.steps:
                check()
                info = self.train_step()
                done = self.step - first
                elapsed = time.monotonic() - started
                info.update(steps=self.config.steps, seconds=elapsed,
                            step_seconds=elapsed / done,
                            eta=elapsed / done * (self.config.steps - self.step))
                emit("progress", **info)
                every = self.config.save_every
                if checkpoint is not None and every and self.step % every == 0 \
                        and self.step < self.config.steps:
                    self.save_checkpoint(checkpoint)
                    emit("checkpoint", step=self.step, path=str(checkpoint))
        finally:
            self.model.check = lambda: None


def _write_atomic(path: Path, blob: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(blob)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
