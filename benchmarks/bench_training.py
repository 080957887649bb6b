"""Training benchmark: train (or take) the demo adapter and measure it, as served.

1. Optionally train the demo adapter from resources/demo/train.jsonl with the recorded
   settings (`--train`), and ship it into resources/demo/ (`--ship`).
2. Held-out exact-match accuracy, base against variant, through the engine process on
   llama.cpp, and on OpenVINO (`--openvino`: the curated OpenVINO default built from
   the embedded GGUF, with the adapter's PEFT form).
3. Drift on unrelated text: mean NLL per token, base against variant (llama.cpp).
4. The parity gate's figures: trainer against llama.cpp, without and with the adapter.

Everything runs in a scratch data directory. Results go to resources/demo/results.json
(with `--ship` or `--results`) and stdout.
Usage: nice -n 10 .venv/bin/python -m benchmarks.bench_training [--train] [--ship]
       [--openvino] [--heldout N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", action="store_true", help="train the demo adapter now")
    parser.add_argument("--ship", action="store_true",
                        help="copy the trained adapter and results into resources/demo")
    parser.add_argument("--results", action="store_true",
                        help="write resources/demo/results.json")
    parser.add_argument("--openvino", action="store_true", help="also measure on OpenVINO")
    parser.add_argument("--heldout", type=int, default=0, help="only the first N held-out")
    parser.add_argument("--no-parity", action="store_true")
    parser.add_argument("--settings", type=json.loads, default={},
                        help='with --train: JSON overriding DEMO_SETTINGS, e.g. '
                        '\'{"kl": 0.3}\' (how docs/training.md\'s --kl table was made)')
    parser.add_argument("--kl-text", default=None, metavar="FILE",
                        help="with --train: the KL text (default: the demo's own, "
                        "resources/demo/kl_prose.txt; \"\" for the prompts' text)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="vs-bench-training-"))
    os.environ["VARIANT_STUDIO_HOME"] = str(home)
    sys.path.insert(0, str(ROOT))

    from engine.catalog import imports
    from engine.catalog.store import Catalog
    from engine.curated import demo as shipped
    from engine.curated import embedded as defaults
    from engine.curated import setup
    from engine.training import demo, demo_eval, served_check
    from engine.training.client import TrainingJob
    from engine.training.job import TrainRequest

    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    base = defaults.DEFAULT_MODEL_NAME
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    folder = demo.resources_dir()
    if args.train:
        log("training the demo adapter…")

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "progress":
                log(f"  step {event['step']}/{event['steps']} loss {event['loss']:.4f} "
                    f"({event['seconds']:.0f} s)")
            elif event.get("event") in ("warning", "stage"):
                log(f"  {event.get('message') or event.get('stage')}")

        kl_text = str(folder / shipped.DEMO_KL_TEXT) if args.kl_text is None else args.kl_text
        request = TrainRequest(name="demo-trained", base=base,
                               data=str(folder / "train.jsonl"),
                               settings={**demo.DEMO_SETTINGS, **args.settings},
                               variant="demo-trained-v", kl_text=kl_text or None)
        started = time.monotonic()
        trained = TrainingJob(request, on_event).start().wait()
        results["training"] = {"wall_seconds": round(time.monotonic() - started, 1),
                               "train_seconds": trained["provenance"]["time"]["train_seconds"],
                               "loss": {k: trained["provenance"]["loss"][k]
                                        for k in ("first", "last", "mean_last_10")},
                               "files": trained["files"]}
        run_dir = Path(trained["run_dir"])
        adapter_path = run_dir / "adapter.gguf"
        variant = "demo-trained-v"
        if args.ship:
            shutil.copyfile(adapter_path, folder / shipped.SHIPPED_ADAPTER)
            shutil.copyfile(run_dir / "provenance.json", folder / shipped.SHIPPED_PROVENANCE)
            shutil.rmtree(folder / shipped.SHIPPED_PEFT, ignore_errors=True)
            shutil.copytree(run_dir / "peft", folder / shipped.SHIPPED_PEFT)
            log(f"shipped into {folder}")
    else:
        variant = demo.VARIANT_NAME
        adapter_path = Path(catalog.adapter(demo.ADAPTER_NAME)["path"])
        results["adapter_sha256"] = catalog.adapter(demo.ADAPTER_NAME)["sha256"]
    rows = [json.loads(line) for line in (folder / "heldout.jsonl").read_text().splitlines()]
    if args.heldout:
        rows = rows[:args.heldout]

    def progress(done: int, total: int) -> None:
        if done % 10 == 0 or done == total:
            log(f"  {done}/{total}")

    log("held-out accuracy on llama.cpp…")
    results["llama"] = demo_eval.evaluate(catalog, variant, rows, progress=progress)
    log(json.dumps({k: results["llama"][k] for k in ("base", "variant")}))
    log("drift on unrelated text…")
    model_path = Path(catalog.model(base)["path"])
    results["drift"] = served_check.drift(model_path, adapter_path)
    log(json.dumps(results["drift"]))
    if args.openvino:
        from engine.curated import openvino_default

        log("building / finding the OpenVINO default…")
        ov = openvino_default.ensure_default(catalog)
        adapter_name = "demo-trained" if args.train else demo.ADAPTER_NAME
        entry = imports.convert_adapter(catalog, adapter_name, "openvino", ov["name"])
        log(f"held-out accuracy on OpenVINO (PEFT sha256 {entry['sha256'][:16]}…)…")
        results["openvino"] = demo_eval.evaluate(catalog, variant, rows, backend="openvino",
                                                 progress=progress)
        results["openvino"]["peft_sha256"] = entry["sha256"]
        log(json.dumps({k: results["openvino"][k] for k in ("base", "variant")}))
    if not args.no_parity:
        from engine.training import parity

        log("parity gate…")
        results["parity"] = {"base": parity.measure(model_path).to_dict(),
                             "adapter": parity.measure(model_path, adapter_path).to_dict()}
        log(json.dumps(results["parity"]))
    text = json.dumps(results, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    print(text)
    if args.ship or args.results:
        (folder / "results.json").write_text(text)
        log(f"wrote {folder / 'results.json'}")
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
