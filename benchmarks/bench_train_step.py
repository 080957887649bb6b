"""What a training step costs with the KL penalty, side by side on the demo's data.

One process loads the embedded base once and builds three trainers on the demo's
settings: no penalty, the penalty on the prompts (`--kl` alone) and the penalty on the
demo's KL text (`--kl --kl-text`, as the shipped demo). Their steps run interleaved
(one step of each, `--rounds` times), so a change in the machine's load falls on all
three alike; the figures are the median seconds per step and the ratios to the step
without the penalty. The first step of each (warm-up: allocations, MKL's first calls)
is left out. Writes benchmarks/out/train_step.json.
Usage: .venv/bin/python -m benchmarks.bench_train_step [--rounds N] [--numerics float|served]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.common import median, scratch_home, write


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--numerics", choices=("float", "served"), default="float")
    args = parser.parse_args()
    scratch_home()
    from engine.training.config import DETERMINISM_ENV, TrainConfig

    # As the training worker does, before torch is imported.
    os.environ.update(DETERMINISM_ENV)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from engine.catalog.store import Catalog
    from engine.curated import demo, setup
    from engine.curated.embedded import DEFAULT_MODEL_NAME
    from engine.training import data as data_mod
    from engine.training import trainer as trainer_mod
    from engine.training.model import DecoderTorch
    from engine.training.tokenizer import Tokenizer

    catalog = Catalog()
    setup.first_run(catalog)
    base = catalog.model(DEFAULT_MODEL_NAME)
    path = Path(base["path"])
    folder = demo.resources_dir()
    settings = {**demo.DEMO_SETTINGS, "numerics": args.numerics}
    config = TrainConfig.from_dict(settings)
    trainer_mod.set_determinism(config.threads)
    with Tokenizer(path, catalog.base_info(base)) as tok:
        data = data_mod.load(folder / "train.jsonl", tok, config.seq_len, config.train_eot,
                             False, config.steps, config.batch)
        kl_text = data_mod.load_kl_text(folder / demo.DEMO_KL_TEXT, tok, config.seq_len)
    modes: dict[str, tuple[dict[str, Any], Any]] = {
        "none": ({"kl": 0.0}, None),
        "prompts": ({"kl": 1.0}, None),
        "kl_text": ({"kl": 1.0}, kl_text),
    }
    trainers = {}
    for mode, (extra, text) in modes.items():
        model = DecoderTorch(path, numerics=args.numerics)
        trainers[mode] = trainer_mod.Trainer(model, TrainConfig.from_dict(
            {**settings, **extra}), data, base["sha256"], kl_text=text)
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds + 1):
        for mode, trainer in trainers.items():
            started = time.perf_counter()
            trainer.train_step()
            if round_:  # the first step of each is warm-up
                seconds[mode].append(time.perf_counter() - started)
    per_step = {mode: median(values) for mode, values in seconds.items()}
    write("train_step", {
        "numerics": args.numerics, "rounds": args.rounds, "threads": config.threads,
        "seconds_per_step": per_step, "samples": seconds,
        "ratio_to_no_kl": {mode: per_step[mode] / per_step["none"] for mode in modes},
        "kl_text": kl_text.summary(), "demo_steps": config.steps,
    })


if __name__ == "__main__":
    main()
