"""One way from a model name and a front end's settings to an engine request.

The chat, Compare, Evaluate, the CLI (`generate`, `compare`, `parity`, `replay`) and
the local server all build their requests here, so a given name and settings give the
same `SessionSpec`, identity and sampling in every front end: the name is resolved in
one catalog snapshot (`engine.catalog.resolve`: the serving base on the backend asked
for, the OpenVINO profile, the context size: a variant's profile's, a plain base's from
Settings), and the sampling is the name's profile's with the front end's own settings
on top (`Sampling.of_profile`: a None override leaves the profile's value).

A sampling setting out of range raises `SettingError` (a `UsageError`), so a front end
can tell "this setting is wrong" from "this name cannot be served" (the server answers
them with different error codes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from engine.catalog import resolve
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Reader
from engine.errors import StudioError, UsageError
from engine.formats.tool_calls import Constraint, Tool
from engine.runtime import messages

G = TypeVar("G", bound=messages.Generate)


class SettingError(UsageError):
    """A sampling setting a request cannot take (out of range, wrong type)."""


def spec(catalog: Reader, name: str, *, backend: str | None = None,
         ov_profile: str | None = None, n_ctx: int | None = None) -> SessionSpec:
    """What `name` is served as (what a view shows before it asks anything)."""
    return resolve.resolve(catalog, name, n_ctx=n_ctx, backend=backend, ov_profile=ov_profile)


def sampling(catalog: Reader, name: str, base: Sampling | None = None,
             **overrides: Any) -> Sampling:
    """The sampling of a request for `name`: `base` (a replay's recorded sampling) or
    the name's profile's, with `overrides` (None: unchanged) on top."""
    try:
        if base is None:
            return resolve.sampling(catalog, name, **overrides)
        return Sampling.from_dict({**base.to_dict(), **{
            k: v for k, v in overrides.items() if v is not None}})
    except StudioError as exc:
        raise SettingError(exc.message) from None


def request(catalog: Reader, name: str, prompt: messages.Prompt, *,
            kind: type[G] = messages.Generate,
            backend: str | None = None, ov_profile: str | None = None,
            n_ctx: int | None = None, base_sampling: Sampling | None = None,
            top_logprobs: int = 0, constraint: Constraint | None = None,
            tools: Sequence[Tool] | None = None, tool_choice: str = "auto",
            **overrides: Any) -> G:
    """The `Generate` (or `Compare`, with `kind`) request for `name` and `prompt`.

    One snapshot of the catalog serves the whole assembly. `overrides` are sampling
    settings (temperature, top_p, top_k, repeat_penalty, seed, max_tokens, stop);
    `base_sampling` replaces the profile's sampling under them (a replay's);
    `constraint` is what the answer must be (a JSON schema, a tool call). `tools` (the
    chat's) go into the prompt with `tool_choice` as their constraint ("auto",
    "required", "none" or a tool's name), as the server puts an OpenAI request's."""
    snapshot = catalog.snapshot()
    served = spec(snapshot, name, backend=backend, ov_profile=ov_profile, n_ctx=n_ctx)
    chosen = sampling(snapshot, name, base_sampling, **overrides)
    if tools:
        prompt, constraint = with_tools(prompt, tuple(tools), tool_choice, constraint)
    return kind(served, prompt, chosen, top_logprobs, constraint)


def with_tools(prompt: messages.Prompt, tools: tuple[Tool, ...], tool_choice: str,
               constraint: Constraint | None = None
               ) -> tuple[messages.Prompt, Constraint | None]:
    """`prompt` with `tools`, and the constraint `tool_choice` makes of them (kept with a
    response format `constraint` already asks for); "none" leaves the tools out of the
    prompt, as the server does. A choice that names no tool is a `SettingError`."""
    names = [t.name for t in tools]
    if tool_choice not in ("none", "auto", "required", *names):
        raise SettingError(f"tool choice {tool_choice!r} is not one of the tools")
    base = constraint or Constraint()
    wanted = dataclasses.replace(base, tool_choice=tool_choice)
    prompt = dataclasses.replace(prompt, tools=None if tool_choice == "none" else tools)
    return prompt, wanted if wanted.active or prompt.tools else None


def with_seed(generate: G, seed: int) -> G:
    """`generate` with another seed (a regenerated answer)."""
    return dataclasses.replace(generate, sampling=dataclasses.replace(generate.sampling,
                                                                      seed=seed))


def score(catalog: Reader, name: str, items: tuple[messages.ScoreItem, ...], *,
          exact_match: bool = False, per_token: bool = True, backend: str | None = None,
          ov_profile: str | None = None) -> messages.Score:
    """The `Score` request of `items` under `name` (scores use no sampling)."""
    return messages.Score(spec(catalog, name, backend=backend, ov_profile=ov_profile),
                          items, exact_match, per_token)


def cross_check(catalog: Reader, name: str, prompts: tuple[messages.Prompt, ...],
                tokens: int, genai: bool = False, ov_profile: str | None = None
                ) -> messages.CrossCheck:
    """`name` on llama.cpp against OpenVINO (`parity`): the OpenVINO side at the exact
    profile unless `ov_profile` says otherwise (the same F16 weights, at f32)."""
    snapshot = catalog.snapshot()
    return messages.CrossCheck(spec(snapshot, name, backend="llama"),
                               spec(snapshot, name, backend="openvino",
                                    ov_profile=ov_profile or "exact"),
                               prompts, tokens, genai)
