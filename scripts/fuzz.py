"""Longer fuzzing runs, for local use. CI runs a short, derandomized pass of the same
properties (tests/test_fuzz.py, about 1 350 executions).

    .venv/bin/python scripts/fuzz.py                       # hypothesis, 20 000 examples per
                                                           # property, fresh randomness
    .venv/bin/python scripts/fuzz.py --examples 100000
    .venv/bin/python scripts/fuzz.py --atheris gguf --runs 200000
    .venv/bin/python scripts/fuzz.py --atheris safetensors --runs 200000
    .venv/bin/python scripts/fuzz.py --atheris template --runs 50000

The hypothesis mode keeps its example database in the user cache directory (replayed
on the next run) and prints any failing input with a reproduction blob. The atheris mode
(coverage-guided, libFuzzer; atheris is in the test extra) instruments the engine's
readers, starts from a corpus of valid files written by the hostile suite's builders,
and writes any failing input as crash-<sha1> beside that corpus (the path is printed).
The invariant is the same in both: every input ends in a result or a typed refusal,
within 10 s.
Record what you ran and what you fixed in docs/security.md ("Fuzzing").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_hypothesis(examples: int) -> int:
    report = Path(tempfile.mkdtemp(prefix="vs-fuzz-")) / "executions.json"
    env = {**os.environ, "VARIANT_STUDIO_FUZZ_EXAMPLES": str(examples),
           "VARIANT_STUDIO_FUZZ_REPORT": str(report), "QT_QPA_PLATFORM": "offscreen"}
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                            "tests/test_fuzz.py"], cwd=ROOT, env=env)
    if report.exists():
        print(f"executions by outcome: {report.read_text()}")
    return code


def seed_corpus(target: str, folder: Path) -> None:
    """Valid inputs for the fuzzer to start from (written, never committed)."""
    from tests import hostile_cases as h

    if target == "gguf":
        files = {"lora": h.mini_lora(), "base": h.tiny_base(),
                 "two": h.assemble(h.lora_kvs(), h.pair() + h.pair("blk.1.attn_v.weight",
                                                                    n_out=192))}
    elif target == "safetensors":
        header, blob = h.st_entries(h.peft_tensors(rank=2))
        from tests import factories

        files = {"peft": factories.raw_safetensors(header, blob)}
    else:
        files = {"chatml": b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                           b"<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                           b"<|im_start|>assistant\n{% endif %}"}
    for name, data in files.items():
        (folder / name).write_bytes(data)


def run_atheris(target: str, runs: int) -> int:
    import atheris

    # Coverage feedback from our readers, and from Jinja when fuzzing templates.
    with atheris.instrument_imports(include=["engine", "jinja2"] if target == "template"
                                    else ["engine"]):
        import engine.catalog.validation  # noqa: F401
        import engine.formats.artifacts  # noqa: F401
        import engine.formats.gguf_file  # noqa: F401
        import engine.formats.safetensors_file  # noqa: F401
        import engine.formats.templates  # noqa: F401
    from engine.curated import embedded as defaults
    from engine.formats import artifacts
    from engine.formats.templates import Message
    from tests import test_fuzz

    base = artifacts.inspect_path(defaults.embedded_model_path())
    messages = [Message("system", "Be brief."), Message("user", "Hello")]

    def one_input(data: bytes) -> None:
        if target == "gguf":
            test_fuzz.check_gguf_bytes(data, base)  # type: ignore[arg-type]
        elif target == "safetensors":
            test_fuzz.check_safetensors_bytes(data)
        else:
            text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(4096)
            test_fuzz.check_template(text, messages)

    corpus = Path(tempfile.mkdtemp(prefix=f"vs-corpus-{target}-"))
    seed_corpus(target, corpus)
    print(f"corpus and any crash-* files: {corpus}")
    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=65536", "-timeout=30",
                   f"-artifact_prefix={corpus}/", str(corpus)], one_input)
    atheris.Fuzz()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20_000,
                        help="hypothesis examples per property (default 20000)")
    parser.add_argument("--atheris", choices=("gguf", "safetensors", "template"),
                        help="run atheris (coverage-guided) on one target instead")
    parser.add_argument("--runs", type=int, default=100_000, help="atheris executions")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    if args.atheris:
        return run_atheris(args.atheris, args.runs)
    return run_hypothesis(args.examples)


if __name__ == "__main__":
    sys.exit(main())
