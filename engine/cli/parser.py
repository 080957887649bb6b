"""The `variant-studio` argument parser: every command, option and its help text."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, NoReturn

from engine import __version__
from engine.catalog.identity import OPENVINO_PROFILES
from engine.catalog.store import BACKENDS
from engine.errors import UsageError
from engine.export import TARGETS
from engine.formats import architecture

BACKEND_HELP = "llama (llama.cpp, GGUF) or openvino (OpenVINO, PEFT)"
PROFILE_HELP = ("the OpenVINO profile of the OpenVINO default (docs/formats.md, \"Profiles\"): "
                "fast (int4 weights, the default), fast-int8 or exact (F16 weights at f32)")


class Parser(argparse.ArgumentParser):
    """Usage errors become `UsageError` (one line, exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="variant-studio", description="Local custom models: base + LoRA "
                    "adapters + profile = variant.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"variant-studio {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)

    gui = sub.add_parser("gui", help="open the desktop app (the default)")
    gui.add_argument("file", nargs="?", help="an adapter file or folder to import at start")
    gui.add_argument("--check", action="store_true",
                     help="open the window, print what it shows as JSON, and quit")

    _model_parser(sub)
    _adapter_parser(sub)
    variant = sub.add_parser("variant", help="variants").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    vadd = variant.add_parser("add", help="compose a variant from a base and adapters")
    vadd.add_argument("name", help="name of the new variant")
    vadd.add_argument("--base", required=True, help="the base model it runs on")
    vadd.add_argument("--adapter", action="append", required=True, metavar="ADAPTER[:SCALE]",
                      help="an adapter and its scale (default 1); repeat, in order")

    gen = sub.add_parser("generate", help="generate text with a model or variant")
    gen.add_argument("name", help="a base model or variant")
    _generation_flags(gen)
    gen.add_argument("--system", help="system prompt (chat mode; default: the variant's)")
    gen.add_argument("--top-p", type=float, help="nucleus sampling threshold, 0..1")
    gen.add_argument("--top-k", type=int, help="sample among the k most likely tokens (0: all)")
    gen.add_argument("--backend", choices=BACKENDS,
                     help=f"serve on this backend, {BACKEND_HELP} (a variant needs adapter "
                          "files for it)")
    gen.add_argument("--profile", choices=OPENVINO_PROFILES, help=PROFILE_HELP)
    cmp_ = sub.add_parser("compare", help="base and variant side by side")
    cmp_.add_argument("name", metavar="VARIANT", help="the variant to compare with its base")
    _generation_flags(cmp_)
    cmp_.add_argument("--backend", choices=BACKENDS,
                      help=f"serve on this backend, {BACKEND_HELP} (the variant needs "
                           "adapter files for it)")
    cmp_.add_argument("--profile", choices=OPENVINO_PROFILES, help=PROFILE_HELP)
    par = sub.add_parser("parity", help="the same model or variant on llama.cpp and OpenVINO: "
                         "greedy agreement and next-token distributions")
    par.add_argument("name", help="a base model or variant of the embedded model")
    par.add_argument("--prompt", action="append", help="a chat prompt (repeatable; default: "
                     "four built-in prompts)")
    par.add_argument("--tokens", type=int, default=8, help="greedy tokens per prompt (1..256)")
    par.add_argument("--genai", action="store_true", help="also run OpenVINO GenAI's own "
                     "MODE_DYNAMIC LoRA and report what it prints")
    par.add_argument("--profile", choices=OPENVINO_PROFILES, default="exact",
                     help="the OpenVINO side's profile (default: exact, F16 weights at f32)")
    par.add_argument("--json", action="store_true", help="print the whole report as JSON")

    lst = sub.add_parser("list", help="list models, adapters and variants")
    lst.add_argument("--json", action="store_true", help="print JSON")
    show = sub.add_parser("show", help="show one entry with its checks")
    show.add_argument("name", help="a model, adapter or variant")
    show.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser("remove", help="remove an entry (adapters are deleted from the store)")
    rm.add_argument("name", help="a model, adapter or variant nothing else uses")
    status = sub.add_parser("status", help="data directory, catalog and engine state")
    status.add_argument("--json", action="store_true", help="print JSON")
    doctor = sub.add_parser("doctor", help="check the installation and every catalog entry")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    _train_parser(sub)
    _train_rl_parser(sub)
    _serve_parser(sub)
    _export_parser(sub)
    _trust_parser(sub)
    _score_parser(sub)
    _merge_parser(sub)
    return parser


def _merge_parser(sub: Any) -> None:
    from engine.formats.merge import MERGE_TYPES, SURVIVAL_THRESHOLD

    merge = sub.add_parser("merge", help="fold a variant's adapters into a standalone GGUF "
                           "base model, measuring what survives the output's quantization "
                           "(a merge that erases the fine-tune is refused)")
    merge.add_argument("name", metavar="VARIANT", help="the variant to merge (a llama.cpp "
                       "variant over a GGUF base)")
    merge.add_argument("--out", required=True, metavar="NAME",
                       help="name of the new base model (must be free); its file goes to "
                            "<data>/models/NAME/NAME.gguf")
    merge.add_argument("--type", required=True, type=str.lower, choices=list(MERGE_TYPES),
                       metavar="TYPE",
                       help="the output's type: " + ", ".join(MERGE_TYPES) + " (base: the "
                            "base's own types, each adapted tensor requantized to its "
                            "original type; the others are quantized by llama.cpp from an "
                            "F16 merge; 8 bits or more keep a fine-tune, a 4-bit base's own "
                            "grid erases a small one)")
    merge.add_argument("--allow-erased", action="store_true", dest="allow_erased",
                       help=f"keep a merge whose behaviour survival is below "
                            f"{SURVIVAL_THRESHOLD:g}, labelled erased (default: refused, "
                            "nothing added)")
    merge.add_argument("--eval-rows", type=int, dest="eval_rows", metavar="N",
                       help="measure survival on at most N items of the evaluation set "
                            "(default: all of it, up to 256; the demo's held-out set has 60)")
    merge.add_argument("--task-rows", type=int, dest="task_rows", default=16, metavar="N",
                       help="greedy exact-match accuracy of base, variant and merged model "
                            "on the first N items with answers (default 16; 0 skips it)")
    merge.add_argument("--json", action="store_true", help="print the whole report as JSON "
                       "(also when refused)")


def _score_parser(sub: Any) -> None:
    score = sub.add_parser("score", help="score models and variants on a data file: "
                           "teacher-forced mean NLL per token, perplexity and exact match, "
                           "through the served numerics")
    score.add_argument("names", nargs="+", metavar="NAME",
                       help="base models and variants to score, in one engine process")
    score.add_argument("--data", required=True, type=Path, metavar="FILE",
                       help="JSONL in the training formats (text: every token; "
                            "prompt+completion: the completion; messages: the last "
                            "assistant turn), or any other file as text, one item per "
                            "non-empty line")
    score.add_argument("--backend", choices=BACKENDS,
                       help=f"score on this backend, {BACKEND_HELP} (default: each "
                            "model's own)")
    score.add_argument("--profile", choices=OPENVINO_PROFILES, help=PROFILE_HELP)
    score.add_argument("--no-exact-match", action="store_false", dest="exact_match",
                       help="skip exact match (the greedy answer of each prompt+completion "
                            "and messages item) and the tool-call exact match (items whose "
                            "answer is a tool call: an assistant turn with tool_calls, or a "
                            "target that parses as one; the greedy answer's calls compared "
                            "by function name and JSON-equal arguments)")
    score.add_argument("--json", action="store_true",
                       help="print every result as JSON, with per-token log-probabilities")
    ev = sub.add_parser("eval", help="evaluation sets of adapters").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    attach = ev.add_parser("attach", help="keep a copy of a data file as an adapter's "
                           "evaluation set (its latest scores are shown by `show`)")
    attach.add_argument("adapter", help="the adapter the set belongs to")
    attach.add_argument("--data", required=True, type=Path, metavar="FILE",
                        help="the data file (as for `score`; checked line by line)")
    attach.add_argument("--json", action="store_true", help="print the recorded set as JSON")
    replay = sub.add_parser("replay", help="regenerate a recorded answer with the same "
                            "identity, settings and seed, and say whether it is identical")
    replay.add_argument("file", type=Path, metavar="ANSWER.json",
                        help="the output of `generate --json`, a local server response, "
                             "or a replay object")
    replay.add_argument("--json", action="store_true", help="print the verdict as JSON")


def _trust_parser(sub: Any) -> None:
    """Signatures (model-signing, ECDSA P-256 keys) and lineage."""
    from engine.catalog.trust.policy import POLICIES

    key = sub.add_parser("key", help="your signing keys (ECDSA P-256, in the data "
                         "directory under keys/)").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    kcreate = key.add_parser("create", help="make a key pair: the private key readable only "
                             "by you (0600), the public key also trusted under NAME")
    kcreate.add_argument("name", help="name of the new key (refused if it exists)")
    klist = key.add_parser("list", help="your keys: name, fingerprint, private key file")
    klist.add_argument("--json", action="store_true", help="print JSON")
    kexport = key.add_parser("export", help="write a key's public key to a file (to give to "
                             "whoever verifies your adapters)")
    kexport.add_argument("name", help="the key whose public half to write")
    kexport.add_argument("--out", required=True, type=Path, metavar="FILE",
                         help="the file to write (must not exist)")
    trust = sub.add_parser("trust", help="the public keys whose signatures you trust"
                           ).add_subparsers(dest="action", required=True, parser_class=Parser)
    tadd = trust.add_parser("add", help="trust a public key (PEM, ECDSA P-256/384/521; "
                            "anything else is refused)")
    tadd.add_argument("file", type=Path, metavar="PUBKEY_FILE", help="the PEM public key")
    tadd.add_argument("--name", help="the name to trust it under (default: from the file "
                      "name)")
    tlist = trust.add_parser("list", help="trusted keys, the shipped release key first")
    tlist.add_argument("--json", action="store_true", help="print JSON")
    tremove = trust.add_parser("remove", help="stop trusting a key")
    tremove.add_argument("name", help="the trusted key's name")
    sign = sub.add_parser("sign", help="sign an adapter's stored files and its provenance "
                          "record (writes signature.sig beside them)")
    sign.add_argument("name", metavar="ADAPTER", help="the adapter to sign")
    sign.add_argument("--key", required=True, metavar="NAME",
                      help="one of your keys (`key list`)")
    verify = sub.add_parser("verify", help="check an adapter's signature: valid and by "
                            "whom, unsigned, or invalid with the reason (exit 3 unless "
                            "valid)")
    verify.add_argument("name", metavar="ADAPTER", help="the adapter to verify")
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    policy = sub.add_parser("policy", help="this catalog's signature policy, enforced at "
                            "import and when the engine opens a session").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    pset = policy.add_parser("set", help="off (default), warn or require")
    pset.add_argument("value", choices=POLICIES,
                      help="off: never required; warn: unsigned or invalid adapters are "
                           "imported and served with a warning; require: only adapters "
                           "signed by a trusted key")
    pshow = policy.add_parser("show", help="the current policy")
    pshow.add_argument("--json", action="store_true", help="print JSON")
    lineage = sub.add_parser("lineage", help="what a model, adapter or variant was made "
                             "from: continued adapters, data and bases, by digest")
    lineage.add_argument("name", help="a model, adapter or variant")
    lineage.add_argument("--json", action="store_true", help="print the tree as JSON")


def _serve_parser(sub: Any) -> None:
    from engine.serve.config import DEFAULT_HOST, DEFAULT_PORT

    serve = sub.add_parser("serve", help="an OpenAI-compatible server for every base and "
                           "variant, by name (loopback only unless given a key)")
    serve.add_argument("--host", default=DEFAULT_HOST,
                       help=f"address to listen on (default {DEFAULT_HOST}; any other "
                            "needs --api-key)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    serve.add_argument("--api-key", dest="api_key",
                       default=os.environ.get("VARIANT_STUDIO_API_KEY") or None,
                       help="require `Authorization: Bearer KEY` on every request (default: "
                            "$VARIANT_STUDIO_API_KEY, which other users cannot read from "
                            "the process list)")
    serve.add_argument("--variants", help="serve only these models and variants "
                       "(comma-separated names; default: all)")
    serve.add_argument("--max-sessions", dest="max_sessions", type=int, default=4,
                       help="warm sessions kept at once (least recently used closes first)")
    serve.add_argument("--cors-origin", dest="cors_origin",
                       help="send CORS headers for this one origin (default: none, so no "
                            "web page can call the server)")


def _export_parser(sub: Any) -> None:
    export = sub.add_parser("export", help="write what another server engine needs to serve "
                            "a variant (llama-server, vLLM or OpenVINO Model Server), with a "
                            "manifest and a README")
    export.add_argument("name", metavar="VARIANT", help="the variant to export")
    export.add_argument("--target", required=True, choices=tuple(TARGETS),
                        help="llama-server (the adapter GGUFs, a router-mode preset, a "
                             "command line, per-request LoRA ids), vllm (the base in "
                             "Hugging Face format and the variant as one PEFT adapter) or "
                             "ovms (OpenVINO Model Server: the variant merged, its survival "
                             "checked, as an OpenVINO IR with config.json and graph.pbtxt)")
    export.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="the folder to write: new, empty, or a previous export of the "
                             "same variant (then replaced); anything else is refused")
    export.add_argument("--copy-base", action="store_true", dest="copy_base",
                        help="llama-server: copy the base GGUF into DIR (default: reference "
                             "it by path and sha256)")
    export.add_argument("--merge-type", dest="merge_type", type=str.lower,
                        choices=("f16", "bf16", "q8_0"),
                        help="ovms: the merge's type before the IR is built (default f16; "
                             "8 bits or more, so the fine-tune survives)")
    export.add_argument("--eval-rows", type=int, dest="eval_rows", metavar="N",
                        help="ovms: measure the merge's survival on at most N items of the "
                             "variant's evaluation set (default: all)")
    export.add_argument("--task-rows", type=int, dest="task_rows", metavar="N",
                        help="ovms: greedy exact match of base, variant and merged model on "
                             "the first N items with answers (default 16; 0 skips it)")
    export.add_argument("--json", action="store_true", help="print the manifest as JSON")


def _model_parser(sub: Any) -> None:
    model = sub.add_parser("model", help="base models").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    madd = model.add_parser("add", help="register a base model (GGUF file or OpenVINO folder)")
    madd.add_argument("name", help="name of the new base model")
    where = madd.add_mutually_exclusive_group(required=True)
    where.add_argument("--file", type=Path,
                       help="the GGUF file or OpenVINO IR folder (it stays where it is)")
    _download_flags(madd, where, "model")
    madd.add_argument("--backend", choices=BACKENDS,
                      help=f"the backend that serves it, {BACKEND_HELP} (default: by format; "
                           "a download is a GGUF file for llama)")
    madd.add_argument("--source", help="where it came from, for its provenance (with --file; "
                      "a download records its URL or repo and commit)")
    madd.add_argument("--curated", action="store_true", help="mark it as curated")
    model.add_parser("openvino-default", help="build (the first time) and add the curated "
                     "OpenVINO default base, made from the embedded GGUF")


def _adapter_parser(sub: Any) -> None:
    adapter = sub.add_parser("adapter", help="LoRA adapters").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    aadd = adapter.add_parser("add", help="import an adapter for a base model")
    aadd.add_argument("name", help="name of the new adapter")
    aadd.add_argument("--base", required=True, help="the base model it was made for")
    where = aadd.add_mutually_exclusive_group(required=True)
    where.add_argument("--file", type=Path,
                       help="a GGUF LoRA file, or a PEFT folder or .safetensors file")
    _download_flags(aadd, where, "adapter")
    aadd.add_argument("--source", help="where it came from, for its provenance (with --file; "
                      "a download records its URL or repo and commit)")
    aadd.add_argument("--strict", action="store_true",
                      help="refuse unless the adapter declares its base's sha256")
    aconv = adapter.add_parser("convert", help="give an adapter a file for the other backend "
                               "(GGUF <-> PEFT, validated against that backend's base)")
    aconv.add_argument("name", help="the adapter to convert")
    aconv.add_argument("--backend", choices=BACKENDS,
                       help="target backend (default: the one the adapter lacks)")
    aconv.add_argument("--base", help="target base (default: the counterpart of its base)")
    afile = adapter.add_parser("convert-file", help="convert a LoRA file: GGUF -> PEFT folder "
                               "or PEFT -> GGUF file")
    afile.add_argument("source", type=Path, help="the LoRA to convert")
    afile.add_argument("target", type=Path, help="where to write the converted LoRA")
    afile.add_argument("--base", help="the base whose head counts order q/k rows "
                       "(default: the embedded llama.cpp model)")


def _download_flags(parser: argparse.ArgumentParser, where: Any, kind: str) -> None:
    """--url / --hf (beside --file in `where`), --filename, --revision, --sha256."""
    what = "the GGUF file" if kind == "model" else "the adapter file"
    where.add_argument("--url", help=f"download {what} from this http(s) URL (kept in the "
                       "data directory's cache while it downloads; run the command again "
                       "to resume an interrupted download)")
    where.add_argument("--hf", metavar="REPO",
                       help="download from this Hugging Face repository (NAMESPACE/NAME; "
                            "HF_ENDPOINT points at another hub, HF_TOKEN sends a token)")
    parser.add_argument("--filename", metavar="FILE",
                        help="with --hf: the file in the repository" + (
                            " (required: the GGUF file)" if kind == "model" else
                            " (default: the PEFT pair adapter_model.safetensors + "
                            "adapter_config.json)"))
    parser.add_argument("--revision", metavar="REV",
                        help="with --hf: a branch, tag or commit (default main; the commit "
                             "it resolves to is recorded)")
    parser.add_argument("--sha256", metavar="HEX",
                        help="refuse unless the file's sha256 is this (checked before "
                             "anything is added; for a PEFT pair, the weights file)")


def _train_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="train a LoRA adapter through the GGUF file you "
                           "serve (needs the [train] extra)")
    train.add_argument("name", help="name of the new adapter")
    train.add_argument("--base", required=True, help="a GGUF base model in the catalog")
    train.add_argument("--data", required=True, type=Path, help="JSONL training data")
    train.add_argument("--steps", type=int, help="optimizer steps")
    _lora_flags(train)
    train.add_argument("--seq-len", type=int, dest="seq_len",
                       help="tokens per training sequence")
    train.add_argument("--batch", type=int, help="sequences per step")
    train.add_argument("--seed", type=int, help="random seed (same seed, same bytes)")
    train.add_argument("--threads", type=int, help="CPU threads (part of the recorded "
                       "configuration: results are reproducible per thread count)")
    train.add_argument("--numerics", choices=("served", "float"),
                       help="served (default): train through llama.cpp's own roundings "
                       "(8-bit activations, fp16 attention); float: float32 activations, "
                       "as every adapter trained before served became the default "
                       "(December 2026)")
    train.add_argument("--kl", type=float, metavar="WEIGHT",
                       help="keep the adapter close to the base on the prompts' text: "
                       "weight of a KL penalty toward the base (0, the default, is off)")
    train.add_argument("--kl-text", type=Path, dest="kl_text", metavar="FILE",
                       help="with --kl: measure the penalty on this text instead (one "
                       "passage of unrelated prose per line, which the adapter should "
                       "leave alone)")
    train.add_argument("--kl-batch", type=int, dest="kl_batch", metavar="N",
                       help="passages of the KL text per step (default 2)")
    train.add_argument("--train-eot", action="store_true", dest="train_eot",
                       help="also train the end-of-turn token so answers learn to stop")
    train.add_argument("--init-adapter", dest="init_adapter", metavar="ADAPTER",
                       help="continue training this adapter")
    train.add_argument("--save-every", type=int, dest="save_every", metavar="N",
                       help="write a checkpoint every N steps")
    train.add_argument("--resume", type=Path, metavar="CHECKPOINT",
                       help="resume a stopped run from its checkpoint")
    train.add_argument("--dpo", action="store_true", help="preference training (DPO)")
    train.add_argument("--dpo-beta", type=float, dest="dpo_beta",
                       help="DPO strength (needs --dpo)")
    train.add_argument("--variant", help="also create this variant (base + the adapter)")
    train.add_argument("--json", action="store_true", help="print the result as JSON")


def _train_rl_parser(sub: Any) -> None:
    rl = sub.add_parser("train-rl", help="train a LoRA adapter by reinforcement: sample, "
                        "score and train in rounds (GRPO; needs the [train] extra)")
    rl.add_argument("name", help="name of the new adapter")
    rl.add_argument("--base", required=True, help="a GGUF base model in the catalog")
    rl.add_argument("--prompts", required=True, type=Path,
                    help="JSONL prompts: prompt or messages, answer (for exact)")
    rl.add_argument("--reward", required=True, metavar="exact|json-schema:FILE|python:FILE",
                    help="exact (the completion equals the line's answer), json-schema:FILE "
                         "(its first JSON object validates), python:FILE (your "
                         "reward(prompt, completion) -> float, run in the training worker)")
    rl.add_argument("--rounds", type=int, help="sample-score-train rounds (default 4)")
    rl.add_argument("--samples", type=int, help="completions per prompt and round, the "
                    "group of GRPO (default 4)")
    rl.add_argument("--steps-per-round", type=int, dest="steps_per_round", metavar="N",
                    help="optimizer steps on each round's rollouts (default 2)")
    rl.add_argument("--max-tokens", type=int, dest="max_tokens",
                    help="at most this many sampled tokens per completion (default 32)")
    rl.add_argument("--clip", type=float, help="PPO clip of the importance ratios (0.2)")
    rl.add_argument("--kl-beta", type=float, dest="kl_beta",
                    help="weight of the KL penalty towards the base (0.04)")
    _lora_flags(rl)
    rl.add_argument("--seq-len", type=int, dest="seq_len",
                    help="prompt plus completion tokens at most")
    rl.add_argument("--seed", type=int, help="sampling and initialisation seed (same seed, "
                    "same bytes)")
    rl.add_argument("--threads", type=int, help="CPU threads of the trainer (llama.cpp "
                    "samples with one)")
    rl.add_argument("--numerics", choices=("served", "float"),
                    help="the trainer's arithmetic, as train's (default served)")
    rl.add_argument("--init-adapter", dest="init_adapter", metavar="ADAPTER",
                    help="start from this adapter (round 1 samples with it)")
    rl.add_argument("--json", action="store_true", help="print the result as JSON")


def _generation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="apply the chat template")
    parser.add_argument("--max-tokens", type=int, help="at most this many new tokens")
    parser.add_argument("--temperature", type=float, help="0 is greedy (default: the profile's)")
    parser.add_argument("--seed", type=int, help="sampling seed (default: the profile's)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _lora_flags(command: argparse.ArgumentParser) -> None:
    """The LoRA's shape and learning rate, the same for train and train-rl."""
    command.add_argument("--rank", type=int, help="LoRA rank")
    command.add_argument("--alpha", type=float,
                         help="LoRA alpha (the multiplier is alpha/rank)")
    command.add_argument("--lr", type=float, help="learning rate")
    command.add_argument("--targets", help="projections to adapt, e.g. q,v (default: the "
                         "base family's: " + architecture.default_targets_text() + ")")
