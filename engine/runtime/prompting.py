"""From what a request asks to the token ids a session decodes: the one place prompts
are rendered and tokenized.

A chat prompt is rendered with the base's own chat template (sandboxed, `engine.
formats.templates`; a plain transcript when it has none), with the request's system
prompt, else the profile's; raw text is tokenized as it is. Scoring and the merge check
tokenize their texts here too, so a scored or checked item is the tokens a served
request would see. Tools, tool calls and tool results are rendered here too: through
the template when it takes tools, else in the documented generic format
(`engine.formats.tool_calls`).
"""

from __future__ import annotations

from engine.catalog.resolve import SessionSpec
from engine.errors import ContextOverflowError, RefusedError
from engine.formats import tool_calls
from engine.formats.artifacts import BaseModelInfo
from engine.formats.templates import Message
from engine.runtime.backend import ResidentModel
from engine.runtime.messages import Prompt


def prompt_tokens(model: ResidentModel, info: BaseModelInfo, spec: SessionSpec,
                  prompt: Prompt) -> list[int]:
    """`prompt` rendered (chat template, system prompt) and tokenized for `spec`;
    refused when it does not fit the context."""
    if prompt.chat or prompt.messages:
        messages = list(prompt.messages) or [Message("user", prompt.text or "")]
        system = prompt.system if prompt.system is not None else spec.system_prompt
        if system and messages[0].role != "system":
            messages.insert(0, Message("system", system))
        # The one chat rendering, shared with training (`tool_calls.render_chat`).
        text = tool_calls.render_chat(info.chat_template, messages, prompt.tools,
                                      bos_token=special(model, info.bos_token_id),
                                      eos_token=special(model, info.eos_token_id),
                                      declared=spec.tool_format)
    else:
        if not prompt.text:
            raise RefusedError("empty prompt")
        text = prompt.text
    tokens = model.tokenize(text, add_special=info.add_bos, parse_special=True)
    n_ctx = spec.identity.context.n_ctx
    if len(tokens) >= n_ctx - 1:
        raise ContextOverflowError(f"prompt of {len(tokens)} tokens does not fit the "
                                   f"context ({n_ctx})")
    return tokens


def tool_format(info: BaseModelInfo, spec: SessionSpec, prompt: Prompt) -> str | None:
    """The tool-call format `prompt` is rendered and answered in (None: it has no tools,
    tool calls or tool results): the profile's, else the template's (`generic` without
    a template that takes tools)."""
    return tool_calls.chat_format(info.chat_template, prompt.messages, prompt.tools,
                                  spec.tool_format)


def text_tokens(model: ResidentModel, info: BaseModelInfo, text: str) -> list[int]:
    """Raw text as a prompt starts (the base's BOS policy, special tokens parsed)."""
    return model.tokenize(text, add_special=bool(info.add_bos), parse_special=True)


def answer_tokens(model: ResidentModel, text: str) -> list[int]:
    """An answer's own tokens, as training tokenizes a completion (no BOS, special
    tokens taken as text)."""
    return model.tokenize(text, add_special=False, parse_special=False)


def special(model: ResidentModel, token: int | None) -> str:
    """A special token's text for the template (BOS, EOS); "" when the base has none."""
    if token is None or not 0 <= token < model.n_vocab:
        return ""
    return model.token_text(token).decode("utf-8", "replace")
