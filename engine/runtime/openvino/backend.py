"""The OpenVINO backend: one compiled model per base, one infer request per session.

Only the engine process imports this module, and only its engine thread calls into
it. We drive the IR through OpenVINO's own `InferRequest` (stateful KV cache) rather
than `openvino_genai.LLMPipeline`, because the pipeline returns tokens and at most the
chosen token's log-probability, never the logits: driving the model ourselves gives
the same numpy `Sampler`, log-probabilities and teacher-forced adapter effect as the
llama.cpp backend (see docs/formats.md, "OpenVINO runtime").

Dynamic LoRA, the way OpenVINO GenAI's MODE_DYNAMIC works: when the compiled model is
built for a base, every layer that a registered adapter attaches to (by OpenVINO's own
name rule, `engine.formats.openvino_ir`) gets a LoRA branch `y += (x·Aᵀ)·Bᵀ` whose A and B
are model inputs. Each session (infer request) sets its own A and B once: the base
uses rank-0 tensors (an empty adapter set), a variant the concatenation of its
adapters with `scale × alpha / rank` folded into B. So base and variants run side by
side over one copy of the weights, and the compiled model is rebuilt only when a new
adapter reaches a layer that has no branch yet.

The logits are sliced before the output projection (an extra `logits_from` input), so
a prompt computes one row of logits, not one per token.

A base is loaded for one profile (the identity's `compute`): the IR folder of its
weights (F16, int8 or int4, `compress.py`) compiled at the profile's precision. The
precision OpenVINO actually compiled is read back and must be the one the identity
names, so an identity never describes numbers this CPU did not compute.

The per-token loop (`step`) is kept short (docs/performance.md, "Our loop"): its input
tensors are views of buffers the session keeps, written in place and bound each step
(no per-token arrays or dicts), it infers synchronously on the engine
thread (no hand-off to OpenVINO's executor and back), and text pieces come from a
per-token cache where the tokenizer allows it (`TextStream`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino_genai
from openvino import opset13 as ops

from engine.catalog import validation
from engine.catalog.identity import ComputeProfile
from engine.catalog.resolve import AdapterFile
from engine.errors import Cancelled, EngineError, RefusedError
from engine.formats import openvino_ir, safetensors_file
from engine.formats.artifacts import AdapterInfo, BaseModelInfo, inspect_path

# Everything that changes the numbers is fixed here (and so covered by the runtime
# version in the identity): full f32 compute and KV cache, no dynamic quantization.
COMPILE_CONFIG: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
    "PERFORMANCE_HINT": "LATENCY",
    "NUM_STREAMS": "1",
}
# A compressed profile computes at its own precision (`compile_config`); everything else
# stays as above, so only what the identity names differs between the profiles.
_PRECISION_TYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
REQUIRED_INPUTS = ("input_ids", "attention_mask", "position_ids", "beam_idx")
LOGITS_FROM = "logits_from"
POLL_MS = 50
END_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<end_of_turn>",
             "<|end_of_text|>")


@dataclass(frozen=True)
class LoadedAdapter:
    """An adapter's tensors, placed on the layers its attach plan names."""

    sha256: str
    name: str
    plan: openvino_ir.AttachPlan
    layers: dict[str, tuple[np.ndarray, np.ndarray]]  # node -> (A (r, in), B (out, r))
    multiplier_per_scale: float  # alpha / rank (1 when no alpha)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self.layers)


class OvModel:
    """A resident OpenVINO base: tokenizer, base graph, and the compiled LoRA graph
    (a `ResidentModel`)."""

    backend = "openvino"

    def __init__(self, folder: str, sha256: str, info: BaseModelInfo, n_threads: int,
                 compute: ComputeProfile | None = None) -> None:
        self.path = folder
        self.sha256 = sha256
        self.info = info
        self.n_threads = n_threads
        self.compute = compute
        root = Path(folder)
        self.core = ov.Core()
        try:
            self.tokenizer = openvino_genai.Tokenizer(str(root))
            self.base_model = self.core.read_model(str(root / "openvino_model.xml"))
        except RuntimeError as exc:
            raise EngineError(f"OpenVINO could not load {root.name}",
                              details=(str(exc).strip()[-400:],)) from None
        names = {name for port in self.base_model.inputs for name in port.get_names()}
        missing = [n for n in REQUIRED_INPUTS if n not in names]
        if missing or not self.base_model.get_sinks():
            raise RefusedError(f"{root.name}: not a stateful text-generation IR (missing "
                               f"{', '.join(missing) or 'a KV-cache state'}); export it with "
                               "optimum-intel's text-generation-with-past task")
        logits = self.base_model.output(0).get_partial_shape()
        if logits.rank.get_length() != 3 or not logits[2].is_static:
            raise RefusedError(f"{root.name}: unexpected output shape {logits}")
        self.n_vocab = logits[2].get_length()
        self.size_bytes = (root / "openvino_model.bin").stat().st_size
        self.adapters: dict[str, LoadedAdapter] = {}  # registered, by sha256
        self.registered: dict[str, tuple[int, int]] = {}  # node -> (out, in)
        self.builds = 0
        self.compiled: Any = None
        self._end_ids = self._find_end_ids()
        self._sliced = False
        self._pieces = _piece_cache_ok(self)
        # Compiled by the first `register`, so a variant opened first compiles once.

    # -------------------------------------------------------------- vocabulary

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        encoded = self.tokenizer.encode(text, add_special_tokens=add_special)
        return [int(t) for t in encoded.input_ids.data[0]]

    def detokenize(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens) if tokens else ""

    def token_text(self, token: int) -> bytes:
        """The token's text including special tokens (for the template's BOS/EOS)."""
        return self.tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")

    def is_end(self, token: int) -> bool:
        return token in self._end_ids

    def _find_end_ids(self) -> frozenset[int]:
        ids = set()
        if self.info.eos_token_id is not None:
            ids.add(self.info.eos_token_id)
        eos = self.tokenizer.get_eos_token_id()
        if eos >= 0:
            ids.add(int(eos))
        for text in END_TEXTS:  # llama.cpp's end-of-generation heuristics, by token text
            found = self.tokenize(text, add_special=False)
            if len(found) == 1 and self.tokenizer.decode(found) == "":
                ids.add(found[0])
        return frozenset(ids)

    def text_stream(self) -> TextStream:
        return TextStream(self.detokenize, self._pieces)

    # -------------------------------------------------------------- adapters

    def load_adapter(self, adapter: AdapterFile, info: AdapterInfo) -> LoadedAdapter:
        """Read a validated adapter and place its tensors by the attach plan."""
        if adapter.sha256 in self.adapters:
            return self.adapters[adapter.sha256]
        plan = openvino_ir.plan_for(Path(info.path), Path(self.path))
        if not plan.ok:
            raise RefusedError(f"adapter {adapter.name}: {plan.coverage()}"
                               + (f"; {plan.bad_shapes[0]}" if plan.bad_shapes else ""))
        arrays = safetensors_file.load_tensors(safetensors_file.read_header(Path(info.path)))
        halves: dict[str, dict[str, np.ndarray]] = {}
        for name, array in arrays.items():
            parsed = openvino_ir.split_name(name)
            if parsed and parsed[1].startswith(openvino_ir.PREFIX):
                halves.setdefault(parsed[1].removeprefix(openvino_ir.PREFIX),
                                  {})[parsed[0]] = array
        layers = {a.node: (np.ascontiguousarray(halves[a.key]["A"], np.float32),
                           np.ascontiguousarray(halves[a.key]["B"], np.float32))
                  for a in plan.attachments}
        return LoadedAdapter(adapter.sha256, adapter.name, plan, layers,
                             validation.effective_multiplier(info, 1.0))

    def _needs_branches(self, adapters: tuple[LoadedAdapter, ...]) -> bool:
        wanted = set().union(*(a.nodes for a in adapters)) if adapters else set()
        return self.compiled is None or not wanted <= set(self.registered)

    def register(self, adapters: tuple[LoadedAdapter, ...]) -> bool:
        """Register adapters; rebuild the compiled model only if new layers need a branch."""
        rebuild = self._needs_branches(adapters)
        for adapter in adapters:
            self.adapters.setdefault(adapter.sha256, adapter)
        if not rebuild:
            return False
        for adapter in adapters:
            for node, (a, b) in adapter.layers.items():
                self.registered[node] = (b.shape[0], a.shape[1])
        self._compile()
        return True

    def _compile(self) -> None:
        model = self.base_model.clone()
        by_name = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
        params = []
        for index, node_name in enumerate(sorted(self.registered)):
            op = by_name.get(node_name)
            if op is None or op.get_type_name() != "MatMul":
                raise EngineError(f"layer {node_name} is not a MatMul of this model")
            out_f, in_f = self.registered[node_name]
            a = ops.parameter([-1, in_f], ov.Type.f32, name=f"lora_a.{index}")
            b = ops.parameter([out_f, -1], ov.Type.f32, name=f"lora_b.{index}")
            a.output(0).get_tensor().set_names({f"lora_a.{index}"})
            b.output(0).get_tensor().set_names({f"lora_b.{index}"})
            x = op.input_value(0)
            if x.get_element_type() != ov.Type.f32:
                x = ops.convert(x, ov.Type.f32).output(0)
            delta = ops.matmul(ops.matmul(x, a, False, True), b, False, True)
            if op.get_output_element_type(0) != ov.Type.f32:
                delta = ops.convert(delta, op.get_output_element_type(0))
            consumers = list(op.output(0).get_target_inputs())
            add = ops.add(op.output(0), delta)
            for consumer in consumers:
                consumer.replace_source_output(add.output(0))
            params += [a, b]
        self._sliced = _slice_logits(model)
        if params:
            model.add_parameters(params)
        model.validate_nodes_and_infer_types()
        config = compile_config(self.compute, self.n_threads)
        try:
            self.compiled = self.core.compile_model(model, "CPU", config)
        except RuntimeError as exc:
            raise EngineError("OpenVINO could not compile the model",
                              details=(str(exc).strip()[-400:],)) from None
        got = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        wanted = config["INFERENCE_PRECISION_HINT"]
        if _PRECISION_TYPES[wanted] not in got:
            self.compiled = None
            raise RefusedError(f"this CPU computes {got} where the {self.profile_name} profile "
                               f"names {wanted}; rebuild it with `variant-studio model "
                               "openvino-default`")
        self.node_index = {node: i for i, node in enumerate(sorted(self.registered))}
        self.builds += 1

    # -------------------------------------------------------------- sessions

    def _loaded(self, adapters: Sequence[tuple[AdapterFile, AdapterInfo]]
                ) -> tuple[LoadedAdapter, ...]:
        return tuple(self.load_adapter(a, info) for a, info in adapters)

    def needs_rebuild(self, adapters: Sequence[tuple[AdapterFile, AdapterInfo]]) -> bool:
        """Registering these adapters recompiles the model when one reaches a layer
        without a LoRA branch yet; contexts on the old compiled model are then stale."""
        return self.compiled is not None and self._needs_branches(self._loaded(adapters))

    def new_context(self, adapters: Sequence[tuple[AdapterFile, AdapterInfo]], n_ctx: int,
                    n_batch: int) -> OvContext:
        loaded = self._loaded(adapters)
        self.register(loaded)  # the first build already has these adapters' branches
        return OvContext(self, tuple(zip(loaded, (a.scale for a, _ in adapters),
                                         strict=True)), n_ctx)

    @property
    def profile_name(self) -> str:
        return self.compute.name if self.compute else "exact"

    def details(self) -> dict[str, Any]:
        compiled = {}
        if self.compiled is not None:
            compiled = {k: str(self.compiled.get_property(k)) for k in (
                "INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")}
        return {"profile": self.compute.label() if self.compute else "exact (f16 @ f32)",
                "compiled": compiled,
                "adapters_loaded": sorted(self.adapters), "pipeline_builds": self.builds,
                "lora_layers": len(self.registered),
                "adapters_registered": [{"name": a.name, "sha256": sha,
                                         "attached_tensors": a.plan.attached_tensors,
                                         "total_tensors": a.plan.total_tensors}
                                        for sha, a in self.adapters.items()]}

    def close(self) -> None:
        self.compiled = None
        self.adapters.clear()


class OvContext:
    """One session: an infer request with its own KV state and adapter tensors."""

    def __init__(self, model: OvModel, adapters: tuple[tuple[LoadedAdapter, float], ...],
                 n_ctx: int) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.cancelled: Callable[[], bool] = lambda: False
        self.adapter_shas = [a.sha256 for a, _ in adapters]
        self.request = model.compiled.create_infer_request()
        self.attached = 0
        for node, index in model.node_index.items():
            out_f, in_f = model.registered[node]
            a_parts, b_parts = [], []
            for adapter, scale in adapters:
                if node in adapter.layers:
                    a, b = adapter.layers[node]
                    a_parts.append(a)
                    b_parts.append(b * np.float32(scale * adapter.multiplier_per_scale))
            a_all = np.concatenate(a_parts, 0) if a_parts else np.zeros((0, in_f), np.float32)
            b_all = np.concatenate(b_parts, 1) if b_parts else np.zeros((out_f, 0), np.float32)
            self.request.set_tensor(f"lora_a.{index}", ov.Tensor(np.ascontiguousarray(a_all)))
            self.request.set_tensor(f"lora_b.{index}", ov.Tensor(np.ascontiguousarray(b_all)))
            self.attached += bool(a_parts)
        self.tokens: list[int] = []
        self.reused = 0  # every prompt is decoded whole (see `prefill`)
        self._beam = np.zeros(1, np.int32)
        # The one-token step's inputs, bound by `step` and updated in place.
        self._ids = np.zeros((1, 1), np.int64)
        self._position = np.zeros((1, 1), np.int64)
        self._ones = np.ones((1, 256), np.int64)  # attention masks are views of it
        self._zero = np.zeros(1, np.int64)

    @property
    def kv_capacity(self) -> int:
        return self.n_ctx  # the stateful KV cache grows by itself

    @property
    def kv_bytes(self) -> int:
        """Memory of the KV state now (f32 keys and values of the cached tokens)."""
        info = self.model.info
        head_dim = info.embedding_length // max(info.head_count, 1)
        return len(self.tokens) * info.block_count * 2 * info.head_count_kv * head_dim * 4

    def _run(self, tokens: list[int], logits_from: int) -> np.ndarray:
        """Append `tokens` to the KV state; logits for positions >= logits_from."""
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise EngineError(f"context full: {len(self.tokens) + len(tokens)} tokens do not "
                              f"fit in n_ctx={self.n_ctx}")
        if self.cancelled():
            raise Cancelled("cancelled")
        past = len(self.tokens)
        inputs = {
            "input_ids": np.asarray([tokens], np.int64),
            "attention_mask": np.ones((1, past + len(tokens)), np.int64),
            "position_ids": np.arange(past, past + len(tokens), dtype=np.int64)[None],
            "beam_idx": self._beam,
        }
        if self.model._sliced:
            inputs[LOGITS_FROM] = np.asarray([logits_from], np.int64)
        request = self.request
        # Bound as new tensors (copies), never through `start_async(inputs)`: after
        # `step` bound views of its own buffers, OpenVINO's input dispatcher would try to
        # reshape those in place and fails ("Could set new shape") on a longer input.
        for name, value in inputs.items():
            request.set_tensor(name, ov.Tensor(value))
        request.start_async()
        while not request.wait_for(POLL_MS):
            if self.cancelled():
                request.cancel()
                try:
                    request.wait()
                except RuntimeError:
                    pass  # "Infer Request was canceled"
                self.reset()  # the KV state is unknown after an interrupted request
                raise Cancelled("cancelled")
        self.tokens.extend(tokens)
        logits = request.get_tensor("logits").data[0]
        if not self.model._sliced:
            logits = logits[logits_from:]
        return np.array(logits, dtype=np.float32)

    def reset(self) -> None:
        self.request.reset_state()
        self.tokens = []

    def prefill(self, prompt: list[int], reserve: int = 0) -> np.ndarray:
        """Logits after `prompt`, computed from an empty state in one pass (the
        stateful KV cache grows by itself, so `reserve` needs nothing here).

        No prefix is reused: OpenVINO's stateful model cannot drop the tail of its KV
        state, only reset all of it, so an OpenVINO session decodes every prompt whole.
        """
        if not prompt:
            raise EngineError("empty prompt")
        self.reset()
        return self._run(prompt, len(prompt) - 1)[-1]

    def prefill_steps(self, prompt: list[int], reserve: int = 0
                      ) -> Iterator[np.ndarray | None]:
        """`prefill` as one step (see `Context.prefill_steps`)."""
        yield self.prefill(prompt, reserve)

    def step(self, token: int) -> np.ndarray:
        """One token: the inputs are bound as views of buffers kept by the session (no
        per-token dict, no copy by OpenVINO's input dispatcher), and it infers on this
        thread: a single token is short, and handing it to OpenVINO's executor and
        waiting for it cost more than the inference on a busy 2-core machine."""
        past = len(self.tokens)
        if past + 1 > self.n_ctx:
            raise EngineError(f"context full: {past + 1} tokens do not fit in "
                              f"n_ctx={self.n_ctx}")
        if self.cancelled():
            raise Cancelled("cancelled")
        if self._ones.shape[1] < past + 1:
            self._ones = np.ones((1, max(2 * self._ones.shape[1], past + 1)), np.int64)
        self._ids[0, 0] = token
        self._position[0, 0] = past
        # OpenVINO's input dispatcher (`_run`) may copy into a bound tensor of the same
        # shape, so the constant inputs are written every step too.
        self._beam[0] = 0
        self._zero[0] = 0
        request = self.request
        request.set_tensor("input_ids", ov.Tensor(self._ids, shared_memory=True))
        request.set_tensor("position_ids", ov.Tensor(self._position, shared_memory=True))
        request.set_tensor("attention_mask",
                           ov.Tensor(self._ones[:, :past + 1], shared_memory=True))
        request.set_tensor("beam_idx", ov.Tensor(self._beam, shared_memory=True))
        if self.model._sliced:
            request.set_tensor(LOGITS_FROM, ov.Tensor(self._zero, shared_memory=True))
        request.infer()
        self.tokens.append(token)
        # A copy: the next inference writes into the same output tensor.
        return np.array(request.get_output_tensor(0).data[0, -1], dtype=np.float32)

    def score(self, prompt: list[int], continuation: list[int]) -> list[np.ndarray]:
        """Logits predicting each token of `continuation` after `prompt` (teacher forcing)."""
        if not continuation:
            return []
        self.reset()
        rows = self._run(prompt + continuation[:-1], len(prompt) - 1)
        return list(rows[-len(continuation):])

    def close(self) -> None:
        self.request = None


class TextStream:
    """Incremental detokenization: text appears once its bytes form whole characters.

    The detokenizer drops an incomplete UTF-8 sequence, so the decoded text grows only
    when a character is complete; decoding from a few tokens back keeps tokenizers
    that strip a leading space at the start of a sequence from losing it.

    `piece` (optional) gives a token's own text when decoding it alone is known to give
    what it adds in context (None otherwise): then, with nothing pending, a token costs
    a dictionary look-up instead of two runs of the detokenizer model. `OvModel` offers
    it only when streaming a sample text both ways gives the same text (`_piece_cache_ok`).
    """

    def __init__(self, decode: Callable[[list[int]], str],
                 piece: Callable[[int], str | None] | None = None) -> None:
        self.decode = decode
        self.piece = piece
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def feed(self, token: int) -> str:
        if self.piece is not None and self.read == len(self.ids):
            text = self.piece(token)
            if text is not None:
                self.ids.append(token)
                self.prefix, self.read = len(self.ids) - 1, len(self.ids)
                return text
        self.ids.append(token)
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        if len(after) > len(before) and after.startswith(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def finish(self) -> str:
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):] if after.startswith(before) else ""


_PIECE_SAMPLE = ("Hello, world! It's a test: 1 + 2 = 3.\n  Indented \"quotes\" (and) "
                 "[brackets] über café 🌊 end . , ? x\tTab  double  spaces")


class PieceCache:
    """Each token's text decoded alone, once (None: not a whole, plain piece)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.known: dict[int, str | None] = {}

    def __call__(self, token: int) -> str | None:
        if token not in self.known:
            text = self.decode([token])
            self.known[token] = text if text and "\ufffd" not in text else None
        return self.known[token]


def _piece_cache_ok(model: OvModel) -> PieceCache | None:
    """A piece cache for this tokenizer, if streaming with it gives the same text.

    Checked on a sample with spaces, punctuation, accents and an emoji: a detokenizer
    that strips leading spaces or cleans up spaces before punctuation fails it, and
    then every token is decoded in its window as before.
    """
    tokens = model.tokenize(_PIECE_SAMPLE, add_special=False)
    cache = PieceCache(model.detokenize)
    fast, slow = TextStream(model.detokenize, cache), TextStream(model.detokenize)
    fast_text = "".join(fast.feed(t) for t in tokens) + fast.finish()
    slow_text = "".join(slow.feed(t) for t in tokens) + slow.finish()
    return cache if fast_text == slow_text == model.detokenize(tokens) else None


def _slice_logits(model: Any) -> bool:
    """Compute logits only from position `logits_from` on (the lm_head input is sliced)."""
    node = model.output(0).get_node().input_value(0).get_node()
    for _ in range(6):
        if node.get_type_name() == "MatMul":
            break
        if node.get_type_name() not in ("Convert", "Reshape", "Multiply", "Divide", "Tanh"):
            return False
        node = node.input_value(0).get_node()
    else:
        return False
    if node.get_type_name() != "MatMul" or node.input_value(0).get_partial_shape().rank != 3:
        return False
    start = ops.parameter([1], ov.Type.i64, name=LOGITS_FROM)
    start.output(0).get_tensor().set_names({LOGITS_FROM})
    stop = ops.constant(np.asarray([np.iinfo(np.int64).max], np.int64))
    step = ops.constant(np.asarray([1], np.int64))
    axes = ops.constant(np.asarray([1], np.int64))
    hidden = node.input_value(0)
    sliced = ops.slice(hidden, start, stop, step, axes)
    node.input(0).replace_source_output(sliced.output(0))
    model.add_parameters([start])
    return True


def compile_config(compute: ComputeProfile | None, n_threads: int) -> dict[str, Any]:
    """OpenVINO's compile settings for a profile (None or `exact`: COMPILE_CONFIG)."""
    config = dict(COMPILE_CONFIG, INFERENCE_NUM_THREADS=str(n_threads))
    if compute is not None and compute.name != "exact":
        config["INFERENCE_PRECISION_HINT"] = compute.precision
        config["KV_CACHE_PRECISION"] = compute.kv_cache
        if compute.precision == "bf16" and n_threads == 1:
            # OpenVINO 2026.4's CPU plugin dies with SIGFPE at bf16 on one thread
            # (docs/notes.md); the thread count changes no result we report.
            config["INFERENCE_NUM_THREADS"] = "2"
    return config


def load_base(path: str, sha256: str, n_threads: int,
              compute: ComputeProfile | None = None) -> OvModel:
    """Load an OpenVINO base: an IR folder, or a GGUF converted once into the cache."""
    from engine.runtime.openvino import build as openvino_build

    source = Path(path)
    folder = source if source.is_dir() else openvino_build.ir_for_gguf(source, sha256)
    info = inspect_path(folder)
    if not isinstance(info, BaseModelInfo):
        raise RefusedError(f"{source.name}: not a base model")
    return OvModel(str(folder), sha256, info, n_threads, compute)

