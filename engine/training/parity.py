"""The parity gate: does the trainer's forward pass agree with llama.cpp's?

Torch-only (and it loads llama.cpp): run by tests and benchmarks, not by the app.

On a fixed set of sequences, both score every next token of the same token ids from
the same GGUF file (optionally with the same LoRA adapter): llama.cpp in one batch
through the engine's own context wrapper, the trainer through `DecoderTorch` (any
family the architecture description knows). We report top-1 agreement, the largest
and mean absolute difference of the next-token log-probabilities, and the KL
divergence of the next-token distributions.
llama.cpp multiplies quantized weights with quantized activations, so the two are
close, not equal; docs/training.md gives the measured figures and explains them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from engine.formats import artifacts, lora_io
from engine.formats.artifacts import BaseModelInfo
from engine.training.model import DecoderTorch

# Plain prose, chat-formatted text, code and a JSON tool call: the kinds of text
# the trainer is used on. Fixed, so the figures are comparable run to run.
PARITY_TEXTS = (
    "The old lighthouse stood at the edge of the cliff, and every night its keeper "
    "climbed the spiral stairs to light the lamp for the ships passing below.",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "What is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n"
    "Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level.<|im_end|>\n",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nprint([fibonacci(i) for i in range(10)])\n",
    '<|im_start|>user\nWhat will the weather be in Lisbon tomorrow?<|im_end|>\n'
    '<|im_start|>assistant\n{"tool": "get_weather", "args": {"city": "Lisbon", '
    '"day": "tomorrow"}}<|im_end|>\n',
    "Photosynthesis converts light energy into chemical energy: plants take in carbon "
    "dioxide and water and, using sunlight, produce glucose and release oxygen.",
    "In 1969 the Apollo 11 mission landed on the Moon. Neil Armstrong and Buzz Aldrin "
    "walked on the surface while Michael Collins orbited above in the command module.",
)


@dataclass(frozen=True)
class ParityReport:
    sequences: int
    positions: int
    top1_agreement: float
    max_abs_logprob_diff: float  # of the actual next token
    mean_abs_logprob_diff: float
    max_kl: float  # KL(llama.cpp || trainer) of the next-token distribution
    mean_kl: float
    adapter: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def llama_logprobs(path: Path, sequences: list[list[int]], adapter: Path | None,
                   threads: int = 2) -> list[np.ndarray]:
    """llama.cpp's next-token log-probabilities, (len - 1, vocab) per sequence."""
    from engine.catalog.digest import sha256_file
    from engine.catalog.resolve import AdapterFile
    from engine.runtime.llama.backend import LlamaContext, LlamaModel

    model = LlamaModel(str(path), "parity")
    adapters = ()
    if adapter is not None:
        adapters = (AdapterFile("parity", str(adapter), sha256_file(adapter), 1.0),)
    longest = max(len(s) for s in sequences)
    context = LlamaContext(model, adapters, n_ctx=max(256, longest + 8),
                           n_batch=max(256, longest + 8), n_threads=threads)
    out = []
    try:
        for ids in sequences:
            context.reset()
            rows = np.stack(context.score(ids[:1], ids[1:])).astype(np.float64)
            out.append(_log_softmax(rows))
    finally:
        context.close()
        model.close()
    return out


def trainer_logprobs(model: DecoderTorch, sequences: list[list[int]]) -> list[np.ndarray]:
    out = []
    with torch.no_grad():
        for ids in sequences:
            hidden = model.hidden(torch.tensor([ids], dtype=torch.long))[0][0, :-1]
            logits = model.logits(hidden).double().numpy()
            out.append(_log_softmax(logits))
    return out


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def load_adapter(model: DecoderTorch, adapter: Path) -> None:
    """Put a GGUF LoRA into the trainer's model, scaled as llama.cpp scales it."""
    weights = lora_io.read_gguf(adapter)
    model.clear_loras()
    for module, (a, b) in weights.layers.items():
        model.add_lora(module, torch.from_numpy(a.copy()), torch.from_numpy(b.copy()))
    model.set_lora_scale(weights.alpha / weights.rank if weights.alpha else 1.0)


def tokenize_texts(path: Path, info: BaseModelInfo, texts: tuple[str, ...]) -> list[list[int]]:
    from engine.training.tokenizer import Tokenizer

    with Tokenizer(path, info) as tokenizer:
        return [tokenizer.prompt_tokens(text) for text in texts]


def measure(path: Path, adapter: Path | None = None, model: DecoderTorch | None = None,
            texts: tuple[str, ...] = PARITY_TEXTS, threads: int = 2) -> ParityReport:
    """Compare the trainer and llama.cpp on `texts` (with `adapter` on both, if given)."""
    info = artifacts.inspect_path(path)
    assert isinstance(info, BaseModelInfo)
    sequences = tokenize_texts(path, info, texts)
    reference = llama_logprobs(path, sequences, adapter, threads)
    torch.set_num_threads(threads)
    model = model or DecoderTorch(path)
    if adapter is not None:
        load_adapter(model, adapter)
    else:
        model.clear_loras()
    mine = trainer_logprobs(model, sequences)
    agree, diffs, kls = [], [], []
    for ids, ref, got in zip(sequences, reference, mine, strict=True):
        nxt = np.array(ids[1:])
        rows = np.arange(len(nxt))
        agree.append(ref.argmax(-1) == got.argmax(-1))
        diffs.append(np.abs(ref[rows, nxt] - got[rows, nxt]))
        kls.append((np.exp(ref) * (ref - got)).sum(-1))
    agree_all, diff_all, kl_all = (np.concatenate(x) for x in (agree, diffs, kls))
    return ParityReport(
        sequences=len(sequences), positions=int(diff_all.size),
        top1_agreement=float(agree_all.mean()),
        max_abs_logprob_diff=float(diff_all.max()),
        mean_abs_logprob_diff=float(diff_all.mean()),
        max_kl=float(kl_all.max()), mean_kl=float(kl_all.mean()),
        adapter=adapter.name if adapter else None)
