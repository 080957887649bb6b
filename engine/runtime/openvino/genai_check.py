"""OpenVINO GenAI's own MODE_DYNAMIC LoRA, run beside our backend as a cross-check.

Our OpenVINO backend inserts the LoRA branches itself, to get logits. This module
runs the same IR and the same adapter files through `openvino_genai.LLMPipeline`:
the adapters are registered with `AdapterConfig(MODE_DYNAMIC)` when the pipeline is
built and selected per `generate` call (the base is an empty `AdapterConfig()`), with
`scale × alpha / rank` as OpenVINO's alpha (it ignores adapter_config.json's alpha).
Everything OpenVINO prints on stderr while doing so (its only signal for LoRA tensors
that attach to nothing: "There unused LoRA tensors") is captured and returned in the
report, and still copied to the engine's stderr, so it is never lost.

Engine process only; the adapters were validated (digest, safetensors library,
coverage) when their session opened, before OpenVINO reads them here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.catalog import validation
from engine.catalog.resolve import SessionSpec
from engine.errors import Cancelled, EngineError
from engine.formats import artifacts
from engine.runtime.messages import Prompt
from engine.runtime.results import GenAICheck

if TYPE_CHECKING:
    from engine.runtime.sessions import SessionRegistry

UNUSED_MARK = "Unused LoRA tensor:"


@contextlib.contextmanager
def captured_stderr(lines: list[str]) -> Iterator[None]:
    """Collect what anything in this process writes to fd 2, passing it through live.

    fd 2 becomes a pipe; a thread copies every chunk to the real stderr as it arrives
    (so the engine's log, and the tail a crash report shows, lose nothing even if
    native code aborts meanwhile) and keeps it. The lines are added to `lines` when
    the block ends. Nesting works: an inner capture's pass-through feeds the outer one.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError, AttributeError):
        # Room for a burst written by native code that holds the GIL (the pump
        # needs the GIL to drain the pipe): 1 MiB instead of 64 KiB.
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    chunks: list[bytes] = []

    def pump() -> None:
        while data := os.read(read_fd, 1 << 16):
            chunks.append(data)
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(saved, view):]
                except OSError:
                    break

    thread = threading.Thread(target=pump, name="stderr-capture", daemon=True)
    thread.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer is gone: the pump reads to the end
        thread.join(timeout=30)
        if not thread.is_alive():  # else a stray writer (a child?) still holds the pipe
            os.close(read_fd)
            os.close(saved)
        text = b"".join(chunks).decode("utf-8", "replace")
        lines.extend(line for line in text.splitlines() if line.strip())


def openvino_warnings(lines: list[str]) -> list[str]:
    """OpenVINO's warning lines ("[ WARNING ] ...", "Unused LoRA tensor: ...").

    Its format, not any line mentioning a warning: llama.cpp logs to the same stderr.
    """
    return [line for line in lines if "[ WARNING" in line or UNUSED_MARK in line]


def unused_tensors(lines: list[str]) -> list[str]:
    """The layer keys OpenVINO says it left unused (each once, in order)."""
    # OpenVINO may print the same warning more than once (once per getter copy).
    return list(dict.fromkeys(line.split(UNUSED_MARK, 1)[1].strip()
                              for line in lines if UNUSED_MARK in line))


def run(spec: SessionSpec, continuations: list[tuple[int, ...]], prompts: list[Prompt],
        registry: SessionRegistry, cancelled: Callable[[], bool]) -> GenAICheck:
    """Greedy tokens from OpenVINO GenAI for `spec`, and what it printed on stderr."""
    import openvino_genai

    from engine.runtime.cross_check import tokens_for
    from engine.runtime.openvino import backend as openvino_backend
    from engine.runtime.openvino import build as openvino_build

    registry.open(spec, cancelled)  # the files verified before OpenVINO GenAI reads them
    token_lists = [tokens_for(registry, spec, prompt, cancelled) for prompt in prompts]
    path = Path(spec.base_path)
    folder = path if path.is_dir() else openvino_build.exact_ir_for_gguf(
        path, spec.identity.base_sha256)
    stderr: list[str] = []
    outputs: list[list[int]] = []
    with captured_stderr(stderr):
        try:
            config = openvino_genai.AdapterConfig(openvino_genai.AdapterConfig.Mode.MODE_DYNAMIC)
            for adapter in spec.adapters:
                info = artifacts.inspect_path(Path(adapter.path))
                alpha = validation.effective_multiplier(info, adapter.scale)
                config.add(openvino_genai.Adapter(adapter.path), alpha)
            properties = {k: v for k, v in openvino_backend.COMPILE_CONFIG.items()
                          if k in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")}
            pipeline = openvino_genai.LLMPipeline(str(folder), "CPU", adapters=config,
                                                  **properties)
            for tokens, continuation in zip(token_lists, continuations, strict=True):
                if cancelled():
                    raise Cancelled("cancelled")
                generation = openvino_genai.GenerationConfig()
                generation.max_new_tokens = max(1, len(continuation))
                generation.do_sample = False
                generation.adapters = config
                inputs = openvino_genai.TokenizedInputs(_tensor(tokens),
                                                        _tensor([1] * len(tokens)))
                result = pipeline.generate(inputs, generation)
                outputs.append([int(t) for t in result.tokens[0]])
            del pipeline
        except RuntimeError as exc:
            raise EngineError("OpenVINO GenAI failed on this adapter set",
                              details=(str(exc).strip()[-400:],)) from None
    unused = unused_tensors(stderr)
    agreeing = []
    for ours, theirs in zip(continuations, outputs, strict=True):
        n = 0
        for x, y in zip(ours, theirs, strict=False):
            if x != y:
                break
            n += 1
        agreeing.append(n)
    return GenAICheck("MODE_DYNAMIC", tuple(tuple(o) for o in outputs), tuple(agreeing),
                      tuple(stderr), tuple(line for line in stderr if "WARNING" in line),
                      tuple(unused))


def _tensor(values: list[int]) -> Any:
    import numpy as np
    import openvino as ov

    return ov.Tensor(np.asarray([values], dtype=np.int64))
