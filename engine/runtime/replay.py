"""Replay: what regenerates an answer, and the verdict of regenerating it.

Every generation result carries a replay record (`record`, made in the engine process
where the answer was produced): the identity with its parts, the sampling settings and
seed, the prompt as asked (with the system prompt it was answered with pinned, since a
profile's system prompt is not part of the identity), a digest of the prompt's tokens,
and the token ids and texts produced. The front ends keep it: `generate --json` as
`replay`, the local server as `variant_studio.replay`, the chat in each answer.

Replaying is three steps that every front end shares: `load` (or `find` in a parsed
document) the record, `plan` (resolve its model again in today's catalog, name every
part of the identity that differs, and build the same `Generate`), run the plan's
request, then `verdict` (identical, or the first token where it diverged and why).
Greedy answers replay bit for bit: the prefix cache keeps warm = cold.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.catalog.identity import Identity
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Reader
from engine.errors import RefusedError, StudioError
from engine.formats.safeio import open_regular
from engine.formats.tool_calls import Constraint
from engine.runtime import assembly
from engine.runtime.messages import Generate, Prompt
from engine.runtime.results import GenerationResult
from engine.runtime.tokens import first_divergence

FORMAT = "variant-studio-replay/1"
MAX_RECORD_BYTES = 64 << 20


def token_digest(tokens: list[int]) -> str:
    """sha256 of a token id sequence (the prompt's, in a record)."""
    return hashlib.sha256(",".join(map(str, tokens)).encode("ascii")).hexdigest()


def record(spec: SessionSpec, prompt: Prompt, sampling: Sampling, prompt_ids: list[int],
           token_ids: list[int], token_texts: list[str], text: str,
           finish_reason: str | None, constraint: Constraint | None = None
           ) -> dict[str, Any]:
    """The replay record of one answer (a JSON object). A constrained answer's record
    holds its constraint (and the prompt its tools), so replay constrains it again."""
    # The system prompt it was answered with: the request's, else the profile's then.
    system = prompt.system if prompt.system is not None else spec.system_prompt
    pinned = Prompt(prompt.text, prompt.messages, prompt.chat, system, prompt.tools)
    extra = {"constraint": constraint.to_dict()} if constraint is not None else {}
    return {
        "format": FORMAT, "name": spec.name, "kind": spec.kind, "backend": spec.backend,
        "identity": spec.identity.to_dict(), "sampling": sampling.to_dict(),
        "seed": sampling.seed, "prompt": pinned.to_dict(),
        "prompt_tokens": len(prompt_ids), "prompt_sha256": token_digest(prompt_ids),
        "token_ids": list(token_ids), "token_texts": list(token_texts), "text": text,
        "finish_reason": finish_reason, **extra,
    }


@dataclass(frozen=True)
class ReplayRecord:
    """A replay record, checked (see `record` for the fields)."""

    name: str
    kind: str
    identity: Identity
    sampling: Sampling
    prompt: Prompt
    prompt_tokens: int
    prompt_sha256: str
    token_ids: tuple[int, ...]
    token_texts: tuple[str, ...]
    text: str
    finish_reason: str | None
    constraint: Constraint | None = None

    @staticmethod
    def from_dict(data: Any) -> ReplayRecord:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise RefusedError(f"not a replay record (expected format {FORMAT})")
        try:
            ident = dict(data["identity"])
            key = ident.pop("key", None)
            identity = Identity.from_dict(ident)
            if key is not None and key != identity.key:
                raise RefusedError("the record's identity key does not match its parts")
            sampling = Sampling.from_dict(data["sampling"])
            if data.get("seed", sampling.seed) != sampling.seed:
                raise RefusedError("the record's seed does not match its sampling settings")
            ids = data["token_ids"]
            texts = data.get("token_texts") or [""] * len(ids)
            if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int)
                                                for t in ids):
                raise RefusedError("token_ids must be a list of integers")
            if not isinstance(texts, list) or len(texts) != len(ids) or any(
                    not isinstance(t, str) for t in texts):
                raise RefusedError("token_texts must be one text per token id")
            name = data["name"]
            if not isinstance(name, str) or not isinstance(data.get("text", ""), str):
                raise RefusedError("name and text must be strings")
            constraint = (Constraint.from_dict(data["constraint"])
                          if data.get("constraint") is not None else None)
            return ReplayRecord(name, str(data.get("kind", "")), identity, sampling,
                                Prompt.from_dict(data["prompt"]),
                                int(data.get("prompt_tokens", 0)),
                                str(data.get("prompt_sha256", "")), tuple(ids), tuple(texts),
                                data.get("text", ""), data.get("finish_reason"), constraint)
        except StudioError as exc:
            raise RefusedError(f"malformed replay record: {exc.message}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RefusedError(f"malformed replay record: {type(exc).__name__}: {exc}"
                               ) from None


def find(document: Any) -> dict[str, Any]:
    """The replay record in a parsed document: `generate --json` output, a local server
    response, or the record itself."""
    if isinstance(document, dict):
        if document.get("format") == FORMAT:
            return document
        if isinstance(document.get("replay"), dict):
            return document["replay"]
        extra = document.get("variant_studio")
        if isinstance(extra, dict) and isinstance(extra.get("replay"), dict):
            return extra["replay"]
    raise RefusedError("no replay record in it: give the output of `generate --json`, a "
                       "local server response, or a replay object")


def load(path: Path) -> ReplayRecord:
    """Read a replay record from a file (see `find`)."""
    handle, st = open_regular(Path(path))
    with handle:
        if st.size > MAX_RECORD_BYTES:
            raise RefusedError(f"{Path(path).name}: {st.size} bytes is too large for a "
                               "replay record")
        raw = handle.read(MAX_RECORD_BYTES + 1)
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RefusedError(f"{Path(path).name}: not JSON ({type(exc).__name__})") from None
    return ReplayRecord.from_dict(find(document))


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class ReplayPlan:
    """What replaying a record takes today: the request (None when the model cannot be
    resolved any more, `missing` saying why) and how the identity changed."""

    record: ReplayRecord
    request: Generate | None
    current: Identity | None
    changes: tuple[str, ...]
    missing: str | None = None


def plan(catalog: Reader, rec: ReplayRecord) -> ReplayPlan:
    """Resolve the record's model again, on its backend with its context size."""
    try:
        request = assembly.request(catalog, rec.name, rec.prompt,
                                   backend=rec.identity.backend,
                                   n_ctx=rec.identity.context.n_ctx, base_sampling=rec.sampling,
                                   constraint=rec.constraint)
    except StudioError as exc:
        return ReplayPlan(rec, None, None, (), f"the identity no longer exists: "
                                                f"{exc.message}")
    return ReplayPlan(rec, request, request.spec.identity,
                      tuple(identity_changes(rec.identity, request.spec.identity)))


def _short(sha: str | None) -> str:
    return f"{sha[:12]}…" if sha else "none"


def identity_changes(old: Identity, new: Identity) -> list[str]:
    """Every part of the identity that differs, in words."""
    if old.key == new.key:
        return []
    out: list[str] = []
    if old.backend != new.backend:
        out.append(f"the backend changed: {old.backend} → {new.backend}")
    if old.base_sha256 != new.base_sha256 or old.base_name != new.base_name:
        out.append(f"the base changed: {old.base_name} sha256 {_short(old.base_sha256)} → "
                   f"{new.base_name} sha256 {_short(new.base_sha256)}")
    before = {a.name: a for a in old.adapters}
    after = {a.name: a for a in new.adapters}
    for name, a in before.items():
        b = after.get(name)
        if b is None:
            out.append(f"adapter {name} is no longer part of it")
            continue
        if a.sha256 != b.sha256:
            out.append(f"adapter {name}'s digest changed: sha256 {_short(a.sha256)} → "
                       f"{_short(b.sha256)}")
        if a.scale != b.scale:
            out.append(f"adapter {name}'s scale changed: {a.scale:g} → {b.scale:g}")
    out += [f"adapter {name} was added" for name in after if name not in before]
    common = [n for n in before if n in after]
    if common != [n for n in after if n in before]:
        out.append("the adapters' order changed")
    if old.chat_template_sha256 != new.chat_template_sha256:
        out.append(f"the chat template changed: {_short(old.chat_template_sha256)} → "
                   f"{_short(new.chat_template_sha256)}")
    if old.bos_policy != new.bos_policy:
        out.append(f"the BOS policy changed: {old.bos_policy} → {new.bos_policy}")
    if old.runtime != new.runtime:
        out.append(f"the runtime version changed: {old.runtime} → {new.runtime}")
    if old.context != new.context:
        out.append(f"the context changed: n_ctx {old.context.n_ctx}, n_batch "
                   f"{old.context.n_batch} → n_ctx {new.context.n_ctx}, n_batch "
                   f"{new.context.n_batch}")
    return out or ["the identity differs"]


# --------------------------------------------------------------------------- verdict


def verdict(replay_plan: ReplayPlan, result: GenerationResult | None) -> dict[str, Any]:
    """Identical, diverged (where, and why when it can say) or unavailable."""
    rec = replay_plan.record
    out: dict[str, Any] = {
        "name": rec.name, "backend": rec.identity.backend,
        "recorded_identity": rec.identity.key,
        "current_identity": replay_plan.current.key if replay_plan.current else None,
        "same_identity": replay_plan.current is not None
        and replay_plan.current.key == rec.identity.key,
        "identity_changes": list(replay_plan.changes),
        "expected_tokens": len(rec.token_ids), "got_tokens": None,
        "first_divergence": None, "identical": False,
    }
    if result is None:
        out.update(verdict="unavailable", reason=replay_plan.missing)
        return out
    got = list(result.token_ids)
    got_texts = (result.replay or {}).get("token_texts") or [""] * len(got)
    out["got_tokens"] = len(got)
    index = first_divergence(rec.token_ids, got)
    if index is None:
        out.update(verdict="identical", identical=True,
                   reason="identical, although the identity differs: "
                          + "; ".join(replay_plan.changes) if replay_plan.changes else None)
        return out

    def token(ids: tuple[int, ...] | list[int], texts: Any) -> dict[str, Any] | None:
        if index >= len(ids):
            return None  # this side ended there
        return {"id": ids[index], "text": texts[index] if index < len(texts) else ""}

    out["first_divergence"] = {"index": index, "expected": token(rec.token_ids, rec.token_texts),
                               "got": token(got, got_texts)}
    prompt_now = (result.replay or {}).get("prompt_sha256")
    if replay_plan.changes:
        reason = "the identity differs: " + "; ".join(replay_plan.changes)
    elif rec.prompt_sha256 and prompt_now and prompt_now != rec.prompt_sha256:
        reason = "the prompt renders to other tokens now (the same identity)"
    else:
        reason = "the tokens differ under the same identity"
    out.update(verdict="diverged", reason=reason)
    return out


def verdict_line(result: dict[str, Any]) -> str:
    """One line for a person (the CLI's text output, the chat's status)."""
    if result["verdict"] == "identical":
        line = f"identical: {result['expected_tokens']} tokens regenerated bit for bit"
        return line + (f" ({result['reason']})" if result.get("reason") else "")
    if result["verdict"] == "unavailable":
        return f"cannot replay: {result['reason']}"
    div = result["first_divergence"]

    def side(token: dict[str, Any] | None) -> str:
        return "the end" if token is None else f"{token['id']} {token['text']!r}"

    return (f"diverged at token {div['index']}: expected {side(div['expected'])}, got "
            f"{side(div['got'])}; {result['reason']}")
