"""Tokenisation for training: llama.cpp's own tokenizer, from the same GGUF file.

The file is opened vocabulary-only (no weights), so training and serving see the
same token ids for the same text. Chat-formatted examples are rendered with the
same sandboxed chat template and special-token texts that serving uses, through the
same function (`engine.formats.tool_calls.render_chat`), tools included.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

from engine.errors import EngineError, RefusedError
from engine.formats.artifacts import BaseModelInfo
from engine.formats.templates import Message
from engine.formats.tool_calls import Tool, chat_format, render_chat


class Tokenizer:
    """A vocabulary-only llama.cpp model: tokenize, detokenize, end-of-generation ids."""

    def __init__(self, path: Path, info: BaseModelInfo) -> None:
        import llama_cpp

        from engine.runtime.llama.backend import init_runtime, recent_log

        init_runtime()
        self._llama = llama_cpp
        self.info = info
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        params.n_gpu_layers = 0
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise EngineError(f"llama.cpp could not read the vocabulary of {path.name}",
                              details=recent_log())
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.bos_text = self.special_text(info.bos_token_id)
        self.eos_text = self.special_text(info.eos_token_id)

    def close(self) -> None:
        if self._model:
            self._llama.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Tokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False
                 ) -> list[int]:
        raw = text.encode("utf-8")
        capacity = len(raw) + 16
        for _ in range(2):
            buf = (self._llama.llama_token * capacity)()
            n = self._llama.llama_tokenize(self._vocab, raw, len(raw), buf, capacity,
                                           add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            capacity = -n
        raise EngineError("tokenization failed")

    def special_text(self, token: int | None) -> str:
        if token is None or not 0 <= token < self.n_vocab:
            return ""
        buf = ctypes.create_string_buffer(128)
        n = self._llama.llama_token_to_piece(self._vocab, token, buf, 128, 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def detokenize(self, tokens: list[int]) -> str:
        out = b""
        for token in tokens:
            buf = ctypes.create_string_buffer(128)
            n = self._llama.llama_token_to_piece(self._vocab, token, buf, 128, 0, True)
            out += buf.raw[: max(n, 0)]
        return out.decode("utf-8", "replace")

    def is_end(self, token: int) -> bool:
        return bool(self._llama.llama_vocab_is_eog(self._vocab, token))

    # ------------------------------------------------------------------ chat

    def render(self, messages: list[Message], add_generation_prompt: bool,
               tools: Sequence[Tool] | None = None) -> str:
        """The chat template's text, exactly as serving renders it: the same function
        (`tool_calls.render_chat`), so tools, tool calls and tool results are rendered
        in the format a served request with these tools gets."""
        if not self.info.chat_template:
            raise RefusedError("this model has no chat template; use `text` or "
                               "`prompt`/`completion` data")
        return render_chat(self.info.chat_template, messages, tools,
                           bos_token=self.bos_text, eos_token=self.eos_text,
                           add_generation_prompt=add_generation_prompt)

    def tool_format(self, messages: Sequence[Message], tools: Sequence[Tool] | None
                    ) -> str | None:
        """The tool-call format these messages and tools are rendered in (None: none)."""
        return chat_format(self.info.chat_template, messages, tools)

    def prompt_tokens(self, text: str) -> list[int]:
        """Tokens of a rendered prompt, the way serving tokenizes it."""
        return self.tokenize(text, add_special=self.info.add_bos, parse_special=True)
