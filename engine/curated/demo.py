"""The shipped demo: a trained adapter (resources/demo/) and its curated variant.

`tool-calls` turns plain requests into JSON tool calls; how it was trained and how it
is scored lives in `engine.training.demo`. Here are its names and files, and the step
that adds it to a new catalog.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from engine.catalog import digest, evaluation, imports, profiles
from engine.catalog.store import AdapterSpec, Catalog
from engine.catalog.trust import records
from engine.catalog.trust.derived import verify_derived
from engine.catalog.trust.verify import SIGNATURE_FILE
from engine.curated import embedded
from engine.errors import StudioError
from engine.state.statefile import add_notice

ADAPTER_NAME = "tool-calls-lora"
VARIANT_NAME = "tool-calls"
SYSTEM_PROMPT = (
    "Reply with one JSON tool call, {\"tool\": NAME, \"args\": {...}}. Tools: "
    "get_weather(city, day), set_timer(minutes), send_email(to, subject), "
    "play_music(artist), convert_currency(amount, from, to).")

def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description, "parameters": {
            "type": "object", "properties": {k: {"type": t} for k, t in params.items()},
            "required": list(params), "additionalProperties": False}}}


# The five tools of SYSTEM_PROMPT as OpenAI function tools: what a client sends with
# `tools` to have the demo variant answer with real `tool_calls` (docs/serving.md).
TOOLS: list[dict[str, Any]] = [
    _tool("get_weather", "The weather in a city on a day", city="string", day="string"),
    _tool("set_timer", "Set a timer", minutes="integer"),
    _tool("send_email", "Send an email", to="string", subject="string"),
    _tool("play_music", "Play music by an artist", artist="string"),
    _tool("convert_currency", "Convert an amount between currencies", amount="number",
          **{"from": "string", "to": "string"}),
]
# The recorded configuration of the shipped adapter (see its provenance.json): float
# numerics, as the earlier demo, and the KL penalty measured on DEMO_KL_TEXT, which
# holds unrelated text where the base had it (docs/training.md, "The demo").
DEMO_SETTINGS: dict[str, Any] = {
    "targets": ["attn_q", "attn_v"], "rank": 8, "alpha": 16.0, "lr": 2e-3, "steps": 50,
    "batch": 8, "seq_len": 128, "seed": 7, "train_eot": True, "threads": 2,
    "numerics": "float", "kl": 1.0, "kl_batch": 2,
}
# The prose the demo's KL penalty holds the adapter to the base on (resources/demo/):
# twenty paragraphs on other subjects, none of them the drift check's.
DEMO_KL_TEXT = "kl_prose.txt"
# The demo variant's profile: greedy, so the comparison view shows the adapter's effect;
# the tool-call format its adapter was trained to write (`{"tool": NAME, "args": {...}}`,
# the tools described by its system prompt), so a request with OpenAI `tools` gets real
# `tool_calls` back (docs/serving.md, "The demo variant").
TOOL_FORMAT = "tool-args"
DEMO_PROFILE: dict[str, Any] = {"system_prompt": SYSTEM_PROMPT, "temperature": 0.0,
                                "max_tokens": 64, "repeat_penalty": 1.0,
                                "tool_format": TOOL_FORMAT}

SHIPPED_ADAPTER = "adapter.gguf"
SHIPPED_PROVENANCE = "provenance.json"
SHIPPED_PEFT = "peft"
SHIPPED_HELDOUT = "heldout.jsonl"  # attached to the adapter as its evaluation set


def trained_system_prompt(adapter: dict[str, Any]) -> str | None:
    """The system prompt adapter record `adapter` was trained with
    (`profiles.trained_system_prompt`); for the shipped demo adapter, whose signed
    provenance is older than that record, the demo's own (`SYSTEM_PROMPT`)."""
    found = profiles.trained_system_prompt(adapter)
    if found is None and adapter.get("curated") and adapter.get("name") == ADAPTER_NAME:
        return SYSTEM_PROMPT
    return found


def resources_dir() -> Path:
    """resources/demo in the source tree (the app runs from its checkout)."""
    return Path(__file__).resolve().parents[2] / "resources" / "demo"


def shipped() -> bool:
    """Are the demo's files shipped with this installation (`seed_catalog` needs them)?"""
    folder = resources_dir()
    return (folder / SHIPPED_ADAPTER).is_file() and (folder / SHIPPED_PROVENANCE).is_file()


def seed_catalog(catalog: Catalog) -> bool:
    """Add the shipped demo adapter (curated, strictly verified) and its variant.

    Only for the embedded base it was trained on, and only if the shipped file is the
    one its provenance record names. Any problem leaves a notice and no demo entries.
    """
    folder = resources_dir()
    adapter, record_path = folder / SHIPPED_ADAPTER, folder / SHIPPED_PROVENANCE
    if not shipped():
        return False
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        base = catalog.model(embedded.DEFAULT_MODEL_NAME)
        if record.get("base_sha256") != base["sha256"]:
            return False  # trained for another base: not offered
        if digest.hash_uncached(adapter)[0] != record.get("adapter_sha256"):
            add_notice("the shipped demo adapter does not match its provenance record; "
                       "it was not added")
            return False
        imports.add_adapter(catalog, ADAPTER_NAME, base["name"], adapter,
                            source="shipped demo (resources/demo), trained by variant-studio",
                            strict=True, curated=True, provenance=record, shipped=True)
        catalog.add_variant(VARIANT_NAME, base["name"], [AdapterSpec(ADAPTER_NAME, 1.0)],
                            DEMO_PROFILE, curated=True)
    except (StudioError, ValueError, OSError) as exc:
        try:
            catalog.remove(ADAPTER_NAME)
        except StudioError:
            pass
        add_notice(f"the shipped demo could not be added: {exc}")
        return False
    attach_heldout(catalog)
    return True


def adopt_signature(catalog: Catalog) -> bool:
    """A demo seeded before signatures existed gets what a new one has: the shipped
    signature in its store folder, when the stored files are the ones it signs, and the
    record of how its OpenVINO file was converted, when converting again gives that
    file's bytes. Otherwise nothing changes (the engine then refuses the curated demo,
    saying why). True if something was adopted."""
    try:
        record = catalog.adapter(ADAPTER_NAME)
    except StudioError:
        return False
    if not record.get("curated"):
        return False
    adopted = False
    folder = records.adapter_folder(record)
    shipped = resources_dir() / SIGNATURE_FILE
    if shipped.is_file() and not (folder / SIGNATURE_FILE).exists():
        shutil.copyfile(shipped, folder / SIGNATURE_FILE)
        if records.verify_adapter(catalog, ADAPTER_NAME).ok:
            adopted = True
        else:
            (folder / SIGNATURE_FILE).unlink()
    entry = record.get("files", {}).get("openvino")
    if entry is not None and "converted_from" not in entry:
        try:
            meta = catalog.model(record["base"])["metadata"]
            made = {"sha256": record["sha256"], "n_head": int(meta["head_count"]),
                    "n_head_kv": int(meta["head_count_kv"]),
                    "architecture": str(meta.get("architecture") or "llama"),
                    "rebase": [record["base_sha256"], entry["base_sha256"]]}
            derivation = records.derivation_of(record, {"converted_from": made})
            assert derivation is not None
            found = verify_derived(
                Path(entry["path"]), entry["sha256"], entry.get("config_sha256"), derivation,
                records.verify_adapter(catalog, ADAPTER_NAME))
        except (StudioError, KeyError, TypeError, ValueError):
            return adopted
        if found.ok:
            def note(data: dict) -> dict:
                files = data["adapters"].get(ADAPTER_NAME, {}).get("files", {})
                if files.get("openvino", {}).get("sha256") == entry["sha256"]:
                    files["openvino"]["converted_from"] = made
                return data

            catalog.state.update(note)
            adopted = True
    return adopted


def adopt_tool_format(catalog: Catalog) -> bool:
    """A demo variant seeded before profiles declared a tool-call format gets the
    demo's (`TOOL_FORMAT`), when its profile still has the demo's system prompt and no
    format (a user's edits are kept). True if it was adopted. Read first: this runs at
    every start, and only an old catalog is written."""
    def due(data: dict) -> bool:
        variant = data.get("variants", {}).get(VARIANT_NAME)
        profile = variant.get("profile") if isinstance(variant, dict) else None
        return (isinstance(profile, dict) and bool(variant.get("curated"))
                and profile.get("system_prompt") == SYSTEM_PROMPT
                and "tool_format" not in profile)

    def declare(data: dict) -> dict:
        if due(data):  # again under the lock: another process may have done it
            data["variants"][VARIANT_NAME]["profile"]["tool_format"] = TOOL_FORMAT
            adopted.append(True)
        return data

    if not due(catalog.data()):
        return False
    adopted: list[bool] = []
    catalog.state.update(declare)
    return bool(adopted)


def attach_heldout(catalog: Catalog) -> None:
    """Give the demo adapter its held-out set as its evaluation set (the 60 requests
    docs/training.md scores). The file is ours: its rows are counted here, and
    tests/test_scoring.py checks it with the training data's parser."""
    source = resources_dir() / SHIPPED_HELDOUT
    try:
        raw = source.read_bytes()
        rows = sum(1 for line in raw.split(b"\n") if line.strip())
        summary = evaluation.SetSummary("jsonl", hashlib.sha256(raw).hexdigest(), rows, "chat")
        evaluation.attach_trusted(catalog, ADAPTER_NAME, source, summary,
                                  "shipped demo held-out set (resources/demo/heldout.jsonl)")
    except (StudioError, OSError) as exc:  # the demo stays; only its set is missing
        add_notice(f"the demo's held-out set could not be attached: {exc}")
