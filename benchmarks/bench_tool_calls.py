"""Tool calling through the local server, as an agent framework sees it (writes
benchmarks/out/tool_calls.json).

1. Accuracy: each of the demo's 60 held-out requests (resources/demo/heldout.jsonl) is
   sent to `variant-studio serve` with the official `openai` client, with the demo's
   five tools as OpenAI `tools` (`demo.TOOLS`), greedy, once with `tool_choice` left to
   its default "auto" (as an agent framework asks) and once "required" (one call), to
   the demo variant and to its plain base, on llama.cpp and on OpenVINO (the OpenVINO
   default with the demo adapter's PEFT file). A request counts when the answer's one
   tool call has exactly the expected function name and arguments (JSON-equal). Under
   "required" the constraint guarantees a well-formed call from either model; which
   call it is, is the model's; under "auto" the model decides whether to call.
2. The cost of constrained decoding: decode tok/s of the base with and without a JSON
   schema on the same prompts, through the engine, interleaved round by round (aim:
   constrained / free >= 0.9).

Usage: .venv/bin/python -m benchmarks.bench_tool_calls [--rounds N] [--limit N]
       [--no-openvino] [--cost-only]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import median, scratch_home, write

# The story's minimum length keeps a constrained answer about as long as a free one
# (both are cut at 96 tokens), so the two speeds are over similar lengths.
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "story": {"type": "string", "minLength": 400}},
    "required": ["title", "story"], "additionalProperties": False}
COST_PROMPTS = ["Tell me a long story about a lighthouse keeper.",
                "Describe a walk through a city market in detail.",
                "Write a long letter to a friend about your summer."]


def expected_calls(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(request, function name, arguments) of each held-out line, read as the demo's own
    evaluation reads them (`engine.training.demo`)."""
    from engine.training import demo as demo_data

    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(demo_data.request_of(row), demo_data.expected_call(row)["tool"],
             demo_data.expected_call(row)["args"]) for row in rows]


def accuracy(client: Any, model: str, cases: list[tuple[str, str, dict[str, Any]]],
             tools: list[dict[str, Any]], choice: str) -> dict[str, Any]:
    right, wrong_name, no_call, seconds, missed = 0, 0, 0, [], []
    for question, name, arguments in cases:
        start = time.perf_counter()
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], tools=tools,
            tool_choice=choice, parallel_tool_calls=False, temperature=0, seed=7,
            max_tokens=64, extra_body={"repeat_penalty": 1.0})
        seconds.append(time.perf_counter() - start)
        calls = answer.choices[0].message.tool_calls or []
        named = len(calls) == 1 and calls[0].function.name == name
        exact = named and json.loads(calls[0].function.arguments) == arguments
        right += exact
        wrong_name += bool(calls) and not named
        no_call += not calls
        if not exact:
            missed.append({"request": question, "calls": [
                [c.function.name, c.function.arguments] for c in calls]})
    return {"exact": right, "of": len(cases), "accuracy": right / len(cases),
            "wrong_function": wrong_name, "no_call": no_call,
            "median_request_s": median(seconds), "missed": missed[:8]}


def accuracies(catalog: Any, limit: int, openvino: bool) -> dict[str, Any]:
    """`accuracy` of the demo variant and its base through a local server, per backend."""
    import openai

    from engine.catalog import resolve
    from engine.catalog.store import AdapterSpec
    from engine.curated import demo, embedded, openvino_default
    from engine.serve.config import ServeConfig
    from engine.serve.server import ServerThread

    models = {"llama.cpp": {"base": embedded.DEFAULT_MODEL_NAME,
                            "variant": demo.VARIANT_NAME}}
    if openvino:
        openvino_default.ensure_default(catalog)
        catalog.add_variant("tool-calls-openvino", openvino_default.NAME,
                            [AdapterSpec(demo.ADAPTER_NAME, 1.0)], demo.DEMO_PROFILE)
        models["openvino"] = {"base": openvino_default.NAME, "variant": "tool-calls-openvino"}
    cases = expected_calls(demo.resources_dir() / demo.SHIPPED_HELDOUT)[:limit]
    server = ServerThread(ServeConfig(port=0, max_sessions=2), catalog).start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                           timeout=600)
    results: dict[str, Any] = {}
    try:
        for backend, names in models.items():
            compute = resolve.identity(catalog, names["variant"]).compute
            results[f"{backend} profile"] = compute.label() if compute else None
            results[backend] = {f"{role} ({choice})": {
                "model": name, **accuracy(client, name, cases, demo.TOOLS, choice)}
                for role, name in names.items() for choice in ("auto", "required")}
            print(backend, json.dumps(results[backend]))
    finally:
        server.stop()
    return results


def constrained_cost(catalog: Any, base: str, rounds: int) -> dict[str, Any]:
    from engine.formats.tool_calls import Constraint
    from engine.runtime import assembly
    from engine.runtime.client import EngineClient
    from engine.runtime.messages import Prompt

    constraint = Constraint(response_format="json_schema", schema=SCHEMA)
    speeds: dict[str, list[float]] = {"free": [], "json_schema": []}
    tokens: dict[str, list[int]] = {"free": [], "json_schema": []}
    client = EngineClient()
    try:
        for round_ in range(rounds + 1):  # round 0 warms the model up, unrecorded
            for prompt in COST_PROMPTS:
                for kind in ("free", "json_schema") if round_ % 2 else ("json_schema", "free"):
                    request = assembly.request(
                        catalog, base, Prompt(text=prompt, chat=True), max_tokens=96,
                        temperature=0.0, seed=7, repeat_penalty=1.0,
                        constraint=constraint if kind == "json_schema" else None)
                    result = client.submit(request).wait(600)
                    if round_:
                        speeds[kind].append(result.tokens_per_second)
                        tokens[kind].append(len(result.token_ids))
    finally:
        client.close()
    free, constrained = median(speeds["free"]), median(speeds["json_schema"])
    return {"free_tok_s": free, "json_schema_tok_s": constrained,
            "ratio": constrained / free, "aim": 0.9,
            "median_tokens": {k: median([float(t) for t in v]) for k, v in tokens.items()},
            "samples": len(speeds["free"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=60, help="held-out requests to ask")
    parser.add_argument("--no-openvino", action="store_true")
    parser.add_argument("--cost-only", action="store_true",
                        help="only the cost of constrained decoding")
    args = parser.parse_args()
    scratch_home()

    from engine.catalog.store import Catalog
    from engine.curated import embedded, setup

    catalog = Catalog()
    setup.first_run(catalog, with_demo=True)
    base = embedded.DEFAULT_MODEL_NAME
    results = {} if args.cost_only else accuracies(catalog, args.limit, not args.no_openvino)
    cost = constrained_cost(catalog, base, args.rounds)
    write("tool_calls", {"accuracy": results, "constrained_decoding": cost,
                         "note": "the embedded 135M model and the shipped demo adapter "
                                 "(real weights); greedy; tool_choice auto and required"})


if __name__ == "__main__":
    main()
