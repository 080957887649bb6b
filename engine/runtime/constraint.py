"""Constrained decoding: a request's grammar as a token mask, the same on every backend.

The grammar engine is llguidance (docs/notes.md says why not xgrammar). A request's
`Constraint` (`engine.formats.tool_calls`) becomes a Lark grammar in the chat format
of the base (`tool_calls.grammar`); here it is compiled against the resident model's
vocabulary (`ResidentModel.vocabulary`: every token's bytes, read from the model's own
tokenizer, so a GGUF's tokens on llama.cpp and the same tokens in the OpenVINO
detokenizer give one tokenizer) into a `Matcher`, which the one sampler
(`engine.runtime.sampler.Sampler`) asks for the mask of allowed tokens before every
choice and tells the token it chose. So llama.cpp and OpenVINO sessions are constrained
the same way, and a greedy constrained answer replays bit for bit.

A grammar that does not compile is refused (`RefusedError`, a 400 at the server),
never served unconstrained; `schema_error` lets a front end name the bad part of a
request before it reaches the engine. llguidance is imported lazily, so a front end
that never checks a schema never loads it.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import numpy as np

from engine.errors import EngineError, RefusedError
from engine.runtime.backend import ResidentModel

# Grammar limits: a schema so large or so ambiguous that computing a mask would take
# too long is refused when it is compiled (llguidance's own defaults, named here).
_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # setup installs it (pyproject.toml)
        raise EngineError(f"constrained decoding needs llguidance ({exc}); run "
                          "scripts/setup.sh") from None
    return llguidance


def _json_rule_error(schema: Any, style: dict[str, Any]) -> str | None:
    llg = _llguidance()
    if not isinstance(schema, dict):
        return "a JSON schema must be an object"
    styled = {**schema, "x-guidance": {**style, **(schema.get("x-guidance") or {})}}
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(styled))
    except (ValueError, TypeError, RecursionError) as exc:
        return str(exc)
    return _validation_error(grammar)


def _validation_error(grammar: str) -> str | None:
    llg = _llguidance()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None)
    return (messages[0] if messages else "invalid grammar") if is_error else None


def schema_error(schema: Any) -> str | None:
    """Why llguidance cannot compile `schema` as the JSON an answer must be (None: it
    can). Checked without a tokenizer, in any process."""
    from engine.formats.tool_calls import JSON_STYLE

    return _json_rule_error(schema, JSON_STYLE)


def tokenizer(model: ResidentModel) -> Any:
    """llguidance's tokenizer for a resident model (built once per model: about a second
    for a 49k vocabulary)."""
    found = _TOKENIZERS.get(model)
    if found is not None:
        return found
    llg = _llguidance()
    tokens = list(model.vocabulary())
    tokens += [b""] * (model.n_vocab - len(tokens))
    ends = [t for t in range(model.n_vocab) if model.is_end(t)]
    if not ends:
        raise RefusedError("constrained decoding needs the model's end-of-text token")

    class Wrapped:
        eos_token_id = ends[0]
        bos_token_id = None
        special_token_ids = [i for i, t in enumerate(tokens) if t.startswith(b"\xff")]

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: str | bytes) -> list[int]:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            return model.tokenize(text, add_special=False, parse_special=False)

    built = llg.LLTokenizer(llg.TokenizerWrapper(Wrapped()), n_vocab=model.n_vocab,
                            eos_token=ends)
    _TOKENIZERS[model] = built
    return built


class Matcher:
    """One request's grammar state: the mask before each token, and the tokens chosen."""

    def __init__(self, model: ResidentModel, grammar: str) -> None:
        llg = _llguidance()
        self.n_vocab = model.n_vocab
        error = _validation_error(grammar)
        if error:
            raise RefusedError(f"the request's constraint cannot be compiled: {error}")
        self.matcher = llg.LLMatcher(tokenizer(model), grammar, log_level=0)
        if self.matcher.is_error():
            raise RefusedError("the request's constraint cannot be compiled: "
                               f"{self.matcher.get_error()}")
        self.bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of every token the grammar does not allow next to -inf."""
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
        if self.matcher.is_error():
            raise EngineError(f"constrained decoding failed: {self.matcher.get_error()}")
        allowed = np.unpackbits(self.bits.view(np.uint8), bitorder="little")
        allowed = allowed[: logits.shape[0]].astype(bool)
        if not allowed.any():
            raise EngineError("constrained decoding failed: the grammar allows no token")
        logits[~allowed] = -np.inf

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise EngineError(f"constrained decoding failed at token {token}: "
                              f"{self.matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but the end of the answer may follow."""
        return bool(self.matcher.is_stopped())
