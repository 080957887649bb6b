"""The reinforcement loop (`variant-studio train-rl`): sample, score, train, in rounds.

The whole loop runs in the training worker process (`python -m engine.training.worker`),
so the window and the serving engine stay responsive. Each round:

1. **Samples** K completions per prompt with llama.cpp, in this process, through the
   runtime's backend interface (`engine.runtime.backend.load_model`), with the round's
   adapter written as a GGUF in the run directory (round 1: the starting adapter, or
   none). Tokens are chosen by the engine's own sampler (`engine.runtime.sampler`) at
   temperature 1 with no top-k, top-p or repeat penalty, so the log-probability the
   engine reports (log softmax of the raw logits at the chosen token) is exactly that
   of the distribution the token was drawn from. Each sample's seed is fixed by the
   run's seed, the round, the prompt's index and the sample's index.
2. **Scores** them with the reward (engine.training.rewards).
3. **Trains** by group-relative policy gradient (GRPO): a group is the K samples of one
   prompt; advantage = (reward - group mean) / (group std + eps); a group whose rewards
   are all equal has no advantage and is left out (no gradient, not even the KL term).
   The rollouts are written as token lines (`{"tokens", "mask", "weight": advantage}`)
   and read back through the training data's token-line checks, so the trainer is fed
   exactly the sampled ids: nothing is re-tokenized.
4. Before training, the trainer **scores the sampled tokens** with the adapter that
   sampled them and reports how far its log-probabilities are from the sampler's (mean
   and max |delta|, the share equal to float32 rounding, the share within
   `TOLERANCE`); the policy term corrects for the gap with importance ratios
   exp(logp_trainer - logp_sampler), clipped PPO-style at 1 +- clip.
5. **Records** the round (rewards, agreement, steps, times) in the provenance record
   and sends a `round` event.

The KL reference is the base with the adapter switched off, as DPO's is (no second
copy of the weights). Same seed, prompts, reward, settings, base and code: the same
adapter bytes (llama.cpp samples with one thread; PyTorch is deterministic per thread
count). docs/training.md, "Reinforcement loop", has the loss and the measurements.

No torch at import time: the CLI imports `RLRequest` and `prepare`; the loop imports
torch when it first trains.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import validation
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import AdapterFile
from engine.catalog.store import Catalog, now_iso
from engine.curated import setup
from engine.errors import Cancelled, RefusedError, UsageError
from engine.formats import artifacts, lora_io
from engine.formats.artifacts import AdapterInfo, BaseModelInfo
from engine.formats.safeio import printable
from engine.state.statefile import write_json_atomic
from engine.training import ENABLE_HINT, job, provenance, rewards, torch_available
from engine.training import data as data_mod
from engine.training.config import DETERMINISM_ENV, TrainConfig
from engine.training.data import DataError, DataSet, Sequence
from engine.training.rewards import PromptLine, Reward, RewardSpec

Emit = Callable[..., None]
KIND = "rl"
# The engine's sampler at temperature 1 and nothing else: the reported log-probability
# is then the one of the distribution each token was drawn from (importance ratios
# need exactly that).
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "repeat_penalty": 1.0}
SAMPLER_THREADS = 1  # llama.cpp's sums depend on the thread count: one, always
N_BATCH = 64  # prompt chunks, as the engine decodes them
TOLERANCE = 0.05  # nats: "within" in the agreement figures
EXACT = 1e-5  # nats: equal up to the float32 rounding of a log-softmax
ADVANTAGE_EPS = 1e-4
ROUNDS_DIR = "rounds"
# The LoRA and optimiser settings train-rl takes from the train command's set.
TRAIN_KEYS = frozenset({"rank", "alpha", "lr", "targets", "seq_len", "seed", "threads",
                        "numerics"})


@dataclass(frozen=True)
class RLSettings:
    """The loop's own settings (the LoRA ones are a TrainConfig)."""

    rounds: int = 4
    samples: int = 4
    steps_per_round: int = 2
    max_tokens: int = 32
    clip: float = 0.2
    kl_beta: float = 0.04

    def __post_init__(self) -> None:
        for name, low, high in (("rounds", 1, 10_000), ("samples", 2, 256),
                                ("steps_per_round", 1, 1000), ("max_tokens", 1, 4096)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UsageError(f"{name.replace('_', '-')} must be a whole number from "
                                 f"{low} to {high}, got {value!r}")
        for name, low, high in (("clip", 0.0, 10.0), ("kl_beta", 0.0, 100.0)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or not low <= value <= high
                    or (name == "clip" and value == 0)):
                raise UsageError(f"{name.replace('_', '-')} must be a number in "
                                 f"{'(' if name == 'clip' else '['}{low:g}, {high:g}], "
                                 f"got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RLSettings:
        unknown = set(data) - {f.name for f in fields(RLSettings)}
        if unknown:
            raise UsageError(f"unknown reinforcement settings: {', '.join(sorted(unknown))}")
        return RLSettings(**data)


@dataclass(frozen=True)
class RLRequest:
    """What to train. `settings` are LoRA/optimiser values given by the user
    (`TRAIN_KEYS`), `rl` the loop's; `reward_sha256` is filled in by `prepare`, so
    the worker refuses a reward file that changed after the command checked it."""

    name: str
    base: str
    prompts: str
    reward: str
    settings: dict[str, Any] = field(default_factory=dict)
    rl: dict[str, Any] = field(default_factory=dict)
    init_adapter: str | None = None
    run_dir: str | None = None
    register: bool = True
    reward_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["settings"], out["rl"] = dict(self.settings), dict(self.rl)
        return {"kind": KIND, **out}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RLRequest:
        known = {f.name for f in fields(RLRequest)}
        if (not isinstance(data, dict) or data.get("kind") != KIND
                or set(data) - known - {"kind"}):
            raise UsageError("malformed reinforcement request")
        return RLRequest(**{k: v for k, v in data.items() if k != "kind"})


@dataclass(frozen=True)
class PreparedRL:
    request: RLRequest
    train: job.Prepared
    rl: RLSettings
    reward: RewardSpec
    prompts: tuple[PromptLine, ...]
    prompts_sha256: str


def prepare(catalog: Catalog, request: RLRequest) -> PreparedRL:
    """Check a request before any process starts: names, base and starting adapter (as
    `train` checks them), the settings, the reward (a schema is parsed and checked; a
    Python file is only hashed) and every line of the prompt file."""
    unknown = set(request.settings) - TRAIN_KEYS
    if unknown:
        raise UsageError(f"train-rl does not take {', '.join(sorted(unknown))}")
    rl = RLSettings.from_dict(dict(request.rl))
    if not Path(request.prompts).expanduser().is_file():
        raise UsageError(f"prompts file {printable(request.prompts)} does not exist")
    # The schedule spans every optimiser step of every round (no warm-up: the first
    # round's ratios are the ones closest to 1); batch is one group of samples.
    settings = {**request.settings, "steps": rl.rounds * rl.steps_per_round,
                "batch": rl.samples, "warmup": 0}
    train = job.prepare(catalog, job.TrainRequest(
        name=request.name, base=request.base, data=request.prompts, settings=settings,
        init_adapter=request.init_adapter, run_dir=request.run_dir,
        register=request.register))
    reward = rewards.parse_reward(request.reward)
    if request.reward_sha256 is not None and reward.sha256 != request.reward_sha256:
        raise RefusedError(f"reward file {Path(reward.path or '').name} changed since the "
                           "run was prepared")
    prompts, sha = rewards.read_prompts(Path(train.request.data), reward.kind == "exact")
    request = replace(request, prompts=train.request.data, reward_sha256=reward.sha256)
    return PreparedRL(request, train, rl, reward, prompts, sha)


def sample_seed(seed: int, round_: int, prompt: int, sample: int) -> int:
    """The sampler seed of one sample: fixed by the run's seed, the round (1-based) and
    the prompt's and sample's index (0-based), independent of every other sample."""
    return int(np.random.SeedSequence([seed, round_, prompt, sample]).generate_state(1)[0])


# ---------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Rollout:
    """One sampled completion: its ids (the end token included when it was drawn, so
    stopping is trained too), the sampler's log-probability of each, and its text."""

    prompt: int
    sample: int
    seed: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish: str  # eos | length


def prompt_tokens(tokenizer: Any, line: PromptLine) -> list[int]:
    """The prompt as serving renders and tokenizes it (engine.runtime.sessions)."""
    if line.messages:
        return tokenizer.prompt_tokens(tokenizer.render(list(line.messages),
                                                        add_generation_prompt=True))
    assert line.prompt is not None
    return tokenizer.prompt_tokens(line.prompt)


def sample_round(model: Any, adapters: list[tuple[AdapterFile, AdapterInfo]],
                 prompts: list[list[int]], rl: RLSettings, seed: int, round_: int,
                 n_ctx: int, cancelled: Callable[[], bool]) -> list[Rollout]:
    """K samples per prompt from a fresh context with `adapters` (the engine's sampler)."""
    from engine.runtime.sampler import Sampler, token_logprob

    context = model.new_context(adapters, n_ctx, N_BATCH)
    context.cancelled = cancelled
    out: list[Rollout] = []
    try:
        for index, prompt in enumerate(prompts):
            for k in range(rl.samples):
                if cancelled():
                    raise Cancelled(f"training cancelled while sampling round {round_}")
                seed_k = sample_seed(seed, round_, index, k)
                sampler = Sampler(Sampling(**SAMPLING, seed=seed_k, max_tokens=rl.max_tokens))
                stream = model.text_stream()
                logits = context.prefill(prompt, reserve=rl.max_tokens)
                tokens: list[int] = []
                logprobs: list[float] = []
                text, finish = "", "length"
                while len(tokens) < rl.max_tokens:
                    token = sampler.choose(logits, prompt + tokens)
                    tokens.append(token)
                    logprobs.append(token_logprob(logits, token))
                    if model.is_end(token):
                        finish = "eos"
                        break
                    text += stream.feed(token)
                    if len(tokens) < rl.max_tokens:
                        logits = context.step(token)
                text += stream.finish()
                out.append(Rollout(index, k, seed_k, tuple(tokens), tuple(logprobs), text,
                                   finish))
    finally:
        context.close()
    return out


# ---------------------------------------------------------------------------- scoring


def advantages(values: list[float]) -> list[float]:
    """GRPO's group-relative advantages: (r - mean) / (std + eps); all zero for a group
    whose rewards are all equal."""
    array = np.asarray(values, dtype=np.float64)
    if np.all(array == array[0]):
        return [0.0] * len(values)
    return [float(a) for a in (array - array.mean()) / (array.std() + ADVANTAGE_EPS)]


def agreement(trainer: list[np.ndarray], sampler: list[tuple[float, ...]]) -> dict[str, Any]:
    """How far the trainer's log-probabilities of the sampled tokens are from the
    sampler's: mean and max |delta| (nats), the share equal up to float32 rounding
    (|delta| <= EXACT) and the share within TOLERANCE."""
    ours = np.concatenate([np.asarray(t, dtype=np.float64) for t in trainer])
    theirs = np.concatenate([np.asarray(s, dtype=np.float64) for s in sampler])
    delta = np.abs(ours - theirs)
    return {"tokens": int(delta.size), "mean_abs": float(delta.mean()),
            "max_abs": float(delta.max()), "exact": float(np.mean(delta <= EXACT)),
            "within": float(np.mean(delta <= TOLERANCE)), "tolerance": TOLERANCE}


def summary(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def write_rollouts(path: Path, prompts: list[list[int]], lines: tuple[PromptLine, ...],
                   rollouts: list[Rollout], scores: list[float], weights: list[float],
                   round_: int) -> str:
    """The round's rollouts as token lines (weight = advantage), the file's sha256.

    They are what the trainer reads back (through the data checks), and an audit of the
    round: any of them can be retrained with `train --data`."""
    rows = []
    for rollout, score, weight in zip(rollouts, scores, weights, strict=True):
        prompt = prompts[rollout.prompt]
        rows.append({
            "tokens": prompt + list(rollout.tokens),
            "mask": [0] * len(prompt) + [1] * len(rollout.tokens),
            "weight": weight,
            "meta": {"round": round_, "prompt_line": lines[rollout.prompt].line,
                     "sample": rollout.sample, "seed": rollout.seed, "reward": score,
                     "finish": rollout.finish, "text": rollout.text,
                     "sampler_logprobs": list(rollout.logprobs)},
        })
    blob = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    import hashlib

    return hashlib.sha256(blob).hexdigest()


def read_rollouts(path: Path, tokenizer: Any, seq_len: int) -> DataSet:
    """The round's token lines through the training data's own checks and encoding."""
    records, sha = data_mod.read_records(path, False, tokenizer.n_vocab)
    examples = data_mod.encode(records, tokenizer, seq_len, False)
    return DataSet(str(path), sha, tuple(examples), ("tokens",), ())


# ---------------------------------------------------------------------------- training


def score_groups(trainer: Any, groups: list[list[Sequence]], adapter: bool
                 ) -> list[list[np.ndarray]]:
    """Per group, per sequence: the trainer's log-probabilities of its targets, without
    gradients, with the adapter on (the policy) or off (the reference)."""
    with trainer.scoring(adapter):
        return [[x.numpy().astype(np.float64) for x in trainer.target_logps(group)]
                for group in groups]


def grpo_step(trainer: Any, groups: list[list[Sequence]], weights: list[list[float]],
              sampler: list[list[np.ndarray]], reference: list[list[np.ndarray]],
              rl: RLSettings) -> dict[str, Any]:
    """One optimiser step over the round's trained groups.

    Per sampled token t of rollout i: ratio = exp(logp(t) - logp_sampler(t)), policy
    term -min(ratio A_i, clip(ratio, 1 - e, 1 + e) A_i), KL term beta (exp(d) - d - 1)
    with d = logp_ref(t) - logp(t) (the k3 estimator of KL(policy || reference)); the
    loss is their sum over every trained token of the round divided by its count. Each
    group's graph is freed after its backward (gradients accumulate), so memory is one
    group's."""
    import torch

    total = sum(len(s) for group in sampler for s in group)
    trainer.zero_grad()
    value = 0.0
    clipped = kl_sum = 0.0
    for group, group_w, group_s, group_r in zip(groups, weights, sampler, reference,
                                                strict=True):
        logps = trainer.target_logps(group)
        terms = []
        for logp, adv, old, ref in zip(logps, group_w, group_s, group_r, strict=True):
            old_t = torch.from_numpy(old.astype(np.float32))
            ref_t = torch.from_numpy(ref.astype(np.float32))
            ratio = torch.exp(logp - old_t)
            bounded = torch.clamp(ratio, 1.0 - rl.clip, 1.0 + rl.clip)
            policy = -torch.minimum(ratio * adv, bounded * adv)
            d = ref_t - logp
            kl = torch.exp(d) - d - 1.0
            terms.append((policy + rl.kl_beta * kl).sum())
            with torch.no_grad():
                clipped += float(((ratio - bounded).abs() > 0).sum())
                kl_sum += float(kl.sum())
        value += trainer.backward(torch.stack(terms).sum() / total)
    info = trainer.update(value, {})
    info.update(clipped=clipped / total, kl=kl_sum / total)
    return info


# ---------------------------------------------------------------------------- the run


def execute(request: RLRequest, emit: Emit, cancelled: Callable[[], bool]) -> dict[str, Any]:
    """The whole loop (worker side): rounds, then the adapter files, record and import."""
    catalog = Catalog()
    setup.first_run(catalog)
    prepared = prepare(catalog, request)
    request, rl = prepared.request, prepared.rl
    config = prepared.train.config
    base = prepared.train.base_record
    started_at = now_iso()
    clock = time.monotonic()
    init = prepared.train.init_record
    info, init_weights = job.check_inputs(catalog, base, init, emit, cancelled)
    model_path = Path(base["path"])
    if not torch_available():
        raise RefusedError(ENABLE_HINT)
    # The user's reward file runs here, in the worker, before anything slow happens.
    reward = rewards.load_reward(prepared.reward)
    run_dir = prepared.train.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)

    from engine.runtime.backend import load_model
    from engine.training.tokenizer import Tokenizer

    emit("stage", stage="reading the prompts")
    with Tokenizer(model_path, info) as tokenizer:
        prompts = _tokenize_prompts(tokenizer, prepared.prompts, config.seq_len,
                                    rl.max_tokens)
        emit("data", examples=len(prompts), sha256=prepared.prompts_sha256,
             prompt_tokens=sum(len(p) for p in prompts), kinds=["prompts"],
             target_tokens=0)
        # Each training step of the loop back-propagates one group of `samples` rollouts.
        estimated = job.check_memory(model_path, replace(config, batch=rl.samples), None,
                                     False, emit)
        emit("stage", stage="loading the sampler (llama.cpp)")
        sampler_model = load_model("llama", str(model_path), base["sha256"],
                                   SAMPLER_THREADS, None, cancelled)
        try:
            loop = _Loop(prepared, emit, cancelled, tokenizer, sampler_model, info,
                         model_path, prompts, reward, init_weights)
            loop.keep_products = bool(estimated["keep_products"])
            loop.run()
        finally:
            sampler_model.close()
    if not catalog.verify_base(base["name"]).ok:
        raise RefusedError(f"base {base['name']} changed on disk during training")

    emit("stage", stage="writing the adapter")
    trainer = loop.trainer
    weights = trainer.weights(info.name)
    files = job.write_adapter_files(run_dir, weights, info.head_count, info.head_count_kv)
    checks = job.check_as_served(model_path, run_dir / job.ADAPTER_FILE, trainer.model,
                                 config.threads, emit, cancelled)
    rounds = loop.records
    record = {
        **job.record_head(files, base, model_path, info.name),
        "data_sha256": prepared.prompts_sha256,
        "data": {"file": Path(request.prompts).name, "path": request.prompts,
                 "sha256": prepared.prompts_sha256, "examples": len(prompts),
                 "kinds": ["prompts"], "prompt_tokens": sum(len(p) for p in prompts)},
        "seed": config.seed,
        "config": config.to_dict(),
        "init_adapter": None if init is None else {
            "name": init["name"], "sha256": init["sha256"], "source": init.get("source")},
        "resumed_from": None,
        "versions": {**provenance.versions(), **_reward_versions(prepared.reward)},
        "platform": provenance.platform_info(),
        "determinism": {"threads": config.threads, "sampler_threads": SAMPLER_THREADS,
                        "deterministic_algorithms": True,
                        "env": {k: os.environ.get(k) for k in DETERMINISM_ENV}},
        "steps": trainer.step,
        "time": {"started": started_at, "finished": now_iso(),
                 "train_seconds": round(sum(r["seconds"]["total"] for r in rounds), 3),
                 "total_seconds": round(time.monotonic() - clock, 3)},
        "loss": provenance.loss_summary(trainer.losses),
        "method": "grpo",
        "served_checks": checks,
        "rl": {
            "settings": rl.to_dict(),
            "reward": {"kind": prepared.reward.kind,
                       "file": Path(prepared.reward.path).name if prepared.reward.path
                       else None, "sha256": prepared.reward.sha256},
            "sampling": {**SAMPLING, "backend": "llama.cpp", "threads": SAMPLER_THREADS,
                         "n_batch": N_BATCH,
                         "seed": "SeedSequence([seed, round, prompt index, sample index])",
                         "logprob": "log softmax of the raw logits at the sampled token"},
            "agreement_tolerance": TOLERANCE, "exact_within": EXACT,
            "advantage_eps": ADVANTAGE_EPS, "kl_reference": "the base (adapter off)",
            "rounds": rounds,
        },
        "trainer": "variant-studio: GRPO on llama.cpp rollouts; LoRA through the GGUF "
                   "file's own quantized tensors, dequantized in memory",
    }
    write_json_atomic(run_dir / job.PROVENANCE_FILE, record)
    write_json_atomic(run_dir / job.PEFT_DIR / job.PROVENANCE_FILE, record)
    result: dict[str, Any] = {"adapter": None, "variant": None, "run_dir": str(run_dir),
                              "files": files, "provenance": record, "checks": checks}
    if request.register:
        emit("stage", stage="importing into the catalog")
        result.update(job.import_run(catalog, request.name, base["name"], run_dir, record,
                                     files))
    return result


def _reward_versions(spec: RewardSpec) -> dict[str, str]:
    if spec.kind != "json-schema":
        return {}
    from importlib import metadata

    return {"jsonschema": metadata.version("jsonschema")}


def _tokenize_prompts(tokenizer: Any, lines: tuple[PromptLine, ...], seq_len: int,
                      max_tokens: int) -> list[list[int]]:
    """Every prompt's ids; one error listing every line that cannot be sampled."""
    from engine.formats.templates import TemplateError

    out, problems = [], []
    for line in lines:
        try:
            ids = prompt_tokens(tokenizer, line)
        except TemplateError as exc:
            problems.append(f"line {line.line}: {exc.message}")
            continue
        if len(ids) + max_tokens > seq_len:
            problems.append(f"line {line.line}: the prompt's {len(ids)} tokens and "
                            f"--max-tokens {max_tokens} exceed --seq-len {seq_len}")
        out.append(ids)
    if problems:
        shown = "; ".join(problems[:data_mod.MAX_REPORTED])
        raise DataError(f"{len(problems)} prompt{'s' if len(problems) != 1 else ''} cannot "
                        f"be sampled: {shown}", details=tuple(problems))
    return out


class _Loop:
    """The rounds: owns the sampler model's adapters per round and the trainer."""

    def __init__(self, prepared: PreparedRL, emit: Emit, cancelled: Callable[[], bool],
                 tokenizer: Any, sampler_model: Any, info: BaseModelInfo, model_path: Path,
                 prompts: list[list[int]], reward: Reward,
                 init_weights: lora_io.LoraWeights | None) -> None:
        self.prepared = prepared
        self.config: TrainConfig = prepared.train.config
        self.rl = prepared.rl
        self.emit = emit
        self.cancelled = cancelled
        self.tokenizer = tokenizer
        self.sampler_model = sampler_model
        self.info = info
        self.model_path = model_path
        self.prompts = prompts
        self.reward = reward
        self.init_weights = init_weights
        self.run_dir = prepared.train.run_dir
        self.trainer: Any = None
        self.keep_products = False  # engine.training.memory's choice for this machine
        self.records: list[dict[str, Any]] = []

    def _adapters(self, round_: int) -> tuple[list[tuple[AdapterFile, AdapterInfo]],
                                              str | None]:
        """What round `round_` samples with, and its sha256 (None: the bare base)."""
        base = self.prepared.train.base_record
        if self.trainer is None:
            init = self.prepared.train.init_record
            if init is None:
                return [], None
            path, sha, name = Path(init["path"]), init["sha256"], init["name"]
        else:
            # The adapter as trained so far, exactly as the run will write it at the end.
            path = self.run_dir / ROUNDS_DIR / f"adapter-round-{round_}.gguf"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            lora_io.write_gguf(tmp, self.trainer.weights(self.info.name))
            os.replace(tmp, path)
            from engine.catalog import digest

            sha, name = digest.hash_uncached(path)[0], f"round-{round_}"
        inspected = artifacts.inspect_path(path)
        if not isinstance(inspected, AdapterInfo):
            raise RefusedError(f"{path.name} is not an adapter")
        report = validation.check_adapter(inspected, self.info, "llama", base["sha256"])
        if not report.ok:
            raise RefusedError(f"round {round_}'s adapter: {report.reason()}")
        return [(AdapterFile(name, str(path), sha, 1.0), inspected)], sha

    def _load_trainer(self, data: DataSet) -> None:
        from engine.training import trainer as trainer_mod
        from engine.training.model import DecoderTorch

        trainer_mod.set_determinism(self.config.threads)
        self.emit("stage", stage="loading the base weights")

        def loading(done: int, total: int) -> None:
            if self.cancelled():
                raise Cancelled("training cancelled while loading the base weights")

        model = DecoderTorch(self.model_path, loading, numerics=self.config.numerics)
        model.keep_products = self.keep_products
        init = self.prepared.train.init_record
        self.trainer = trainer_mod.Trainer(
            model, self.config, data, self.prepared.train.base_record["sha256"],
            self.init_weights, None if init is None else init["sha256"])

    def _check(self) -> None:
        """Called per layer of every forward and backward pass."""
        if self.cancelled():
            raise Cancelled("training cancelled")

    def run(self) -> None:
        rl = self.rl
        lines = self.prepared.prompts
        for round_ in range(1, rl.rounds + 1):
            started = time.monotonic()
            self.emit("stage", stage=f"round {round_}/{rl.rounds}: sampling")
            adapters, adapter_sha = self._adapters(round_)
            rollouts = sample_round(self.sampler_model, adapters, self.prompts, rl,
                                    self.config.seed, round_,
                                    max(self.config.seq_len, 256), self.cancelled)
            sampled = time.monotonic()
            scores = [self.reward(lines[r.prompt], r.text) for r in rollouts]
            weights: list[float] = []
            for start in range(0, len(rollouts), rl.samples):
                weights += advantages(scores[start:start + rl.samples])
            path = self.run_dir / ROUNDS_DIR / f"round-{round_}.jsonl"
            rollouts_sha = write_rollouts(path, self.prompts, lines, rollouts, scores,
                                          weights, round_)
            data = read_rollouts(path, self.tokenizer, self.config.seq_len)
            if self.trainer is None:
                self._load_trainer(data)
            self.trainer.data = data

            self.trainer.model.check = self._check
            try:
                record = self._train(round_, rollouts, scores, data, started, sampled)
            finally:
                self.trainer.model.check = lambda: None
            record.update(adapter_sha256=adapter_sha,
                          rollouts={"file": f"{ROUNDS_DIR}/{path.name}",
                                    "sha256": rollouts_sha})
            self.records.append(record)
            self.emit("round", round=round_, rounds=rl.rounds, reward=record["reward"],
                      agreement=record["agreement"], steps=record["steps"],
                      step=self.trainer.step, loss=record["loss"],
                      seconds=record["seconds"]["total"])

    def _train(self, round_: int, rollouts: list[Rollout], scores: list[float],
               data: DataSet, started: float, sampled: float) -> dict[str, Any]:
        rl = self.rl
        k = rl.samples
        sequences = [e.sequences[0] for e in data.examples]
        weights = [e.weight for e in data.examples]
        groups = [sequences[i:i + k] for i in range(0, len(sequences), k)]
        sampler = [[np.asarray(r.logprobs) for r in rollouts[i:i + k]]
                   for i in range(0, len(rollouts), k)]
        # Before any update: the trainer's scores of every sampled token, with the adapter
        # that sampled them (its weights are what the round's GGUF holds).
        policy = score_groups(self.trainer, groups, adapter=True)
        agree = agreement([x for g in policy for x in g], [r.logprobs for r in rollouts])
        scored = time.monotonic()
        trained = [g for g in range(len(groups)) if any(w != 0 for w in weights[g * k:g * k + k])]
        steps: list[dict[str, Any]] = []
        if trained:
            chosen = [groups[g] for g in trained]
            reference = score_groups(self.trainer, chosen, adapter=False)
            group_w = [weights[g * k:g * k + k] for g in trained]
            group_s = [sampler[g] for g in trained]
            for _ in range(rl.steps_per_round):
                steps.append(grpo_step(self.trainer, chosen, group_w, group_s, reference, rl))
        done = time.monotonic()
        return {
            "round": round_,
            "reward": summary(scores),
            "agreement": agree,
            "groups": len(groups),
            "groups_trained": len(trained),
            "steps": len(steps),
            "loss": [s["loss"] for s in steps],
            "clipped": [s["clipped"] for s in steps],
            "kl": [s["kl"] for s in steps],
            "tokens": sum(len(r.tokens) for r in rollouts),
            "finish": {"eos": sum(r.finish == "eos" for r in rollouts),
                       "length": sum(r.finish == "length" for r in rollouts)},
            "seconds": {"sampling": round(sampled - started, 3),
                        "scoring": round(scored - sampled, 3),
                        "training": round(done - scored, 3),
                        "total": round(done - started, 3)},
        }
