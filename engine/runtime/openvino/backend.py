"""The OpenVINO backend: a prompt graph and one-token graphs per base, a request per session.

Only the engine process imports this module, and only its engine thread calls into
it. We drive the IR through OpenVINO's own `InferRequest` (stateful KV cache) rather
than `openvino_genai.LLMPipeline`, because the pipeline returns tokens and at most the
chosen token's log-probability, never the logits: driving the model ourselves gives
the same numpy `Sampler`, log-probabilities and teacher-forced adapter effect as the
llama.cpp backend (see docs/formats.md, "OpenVINO runtime").

The prompt graph (any sequence length) decodes prompts and teacher-forced scores, with
dynamic LoRA the way OpenVINO GenAI's MODE_DYNAMIC works: every layer that a registered
adapter attaches to (by OpenVINO's own name rule, `engine.formats.openvino_ir`) gets a
branch `y += (x·Aᵀ)·Bᵀ` whose A and B are model inputs; each session binds its own (rank
0 for the base, the concatenation of its adapters with `scale × alpha / rank` folded
into B for a variant). So base and variants share one prompt graph and one request for
it, and it is rebuilt only when a new adapter reaches a layer that has no branch yet.

The token loop runs on a one-token graph instead: the same IR with an input length of 1
fixed at compile time, which OpenVINO's CPU plugin runs about 1.15x faster per token (it
fuses the element-wise nodes and skips per-node shape inference). Its LoRA branches have
static ranks, so there is one per rank layout (every rank-8 q/v adapter shares one; the
base's has no branch), and the branches of layers that read the same input are merged:
with dynamic ranks a variant ran at 0.84-0.89 of its base's speed, this way at about
0.95. After a prompt its KV state moves from the prompt request into the session's own
one-token request (`OvContext.prefill`). The logits equal the prompt graph's fed one token
at a time, to the bit (tests/test_openvino_profiles.py). Each one-token graph holds its
own copy of the weights, so the `exact` profile, whose F16 weights compile to f32, steps
on its prompt graph instead.

The logits are sliced before the output projection (an extra `logits_from` input), so
a prompt computes one row of logits, not one per token.

A base is loaded for one profile (the identity's `compute`): the IR folder of its
weights (F16, int8 or int4, `compress.py`) compiled at the profile's precision. The
precision OpenVINO actually compiled is read back and must be the one the identity
names, so an identity never describes numbers this CPU did not compute.

The per-token loop (`step`) is kept short (docs/performance.md, "OpenVINO profiles"):
its input tensors are views of buffers the session keeps, bound once and written in
place (no per-token arrays or dicts), it infers synchronously on the engine thread (no
hand-off to OpenVINO's executor and back), and text pieces come from a per-token cache
where the tokenizer allows it (`TextStream`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from engine.runtime.openvino import probe

# Everything that changes the numbers is fixed here (and so covered by the runtime
# version in the identity): full f32 compute and KV cache, no dynamic quantization.
COMPILE_CONFIG: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
    "PERFORMANCE_HINT": "LATENCY",
    "NUM_STREAMS": "1",
}
# A compressed profile computes at its own precision and activation quantization
# (`compile_config`); everything else stays as above, so only what the identity names
# differs between the profiles.
_PRECISION_TYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
REQUIRED_INPUTS = ("input_ids", "attention_mask", "position_ids", "beam_idx")
LOGITS_FROM = "logits_from"
# The token loop's graph: one token in, the attention mask as long as the state.
ONE_TOKEN = {"input_ids": [1, 1], "position_ids": [1, 1], "attention_mask": [1, -1],
             "beam_idx": [1]}
MAX_STEPPERS = 2  # one-token graphs kept per base (each holds its own copy of the weights)
# Per layer (MatMul name): A (rank × in) and the scaled B (out × rank) of a session.
Branches = dict[str, tuple[np.ndarray, np.ndarray]]
# What a one-token graph is compiled for: the rank a session's adapters put on each layer
# (sorted; layers its adapters reach at a non-zero scale only). Every adapter set with
# the same ranks (a family of rank-8 q/v adapters, say) shares one graph.
Layout = tuple[tuple[str, int], ...]
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
        self.compiled: Any = None  # the prompt graph: any sequence length, any rank
        self.node_index: dict[str, int] = {}  # registered layer -> its LoRA inputs' number
        # One-token graphs by the ranks a session's adapters put on each layer (`stepper`),
        # with their branch groups; for the compressed profiles only.
        self.steppers: OrderedDict[Layout, tuple[Any, list[list[str]]]] = OrderedDict()
        self.one_token_graphs = compute is not None and compute.weights != "f16"
        bf16 = compile_config(compute, n_threads)["INFERENCE_PRECISION_HINT"] == "bf16"
        # One inference thread at bf16 only where a child process found it safe.
        self.bf16_one_thread = bf16 and n_threads == 1 and probe.bf16_one_thread_ok(root)
        # Adapter tensors in the precision the model computes at, so OpenVINO does not
        # convert every one at every token.
        self.lora_type = ov.Type.bf16 if bf16 else ov.Type.f32
        self._prompt_request: Any = None  # shared by every session (see OvContext)
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

    def vocabulary(self) -> list[bytes]:
        """Every token's bytes, read from the detokenizer's own vocabulary (its
        `VocabDecoder` node's constants: the bytes each id decodes to, which the GGUF's
        tokens are on llama.cpp too); the tokens it skips as special get b"\\xff"."""
        path = Path(self.path) / "openvino_detokenizer.xml"
        try:
            graph = _tokenizer_core().read_model(str(path))
        except RuntimeError as exc:
            raise RefusedError(f"{Path(self.path).name}: its detokenizer cannot be read for "
                               "constrained decoding", details=(str(exc)[-300:],)) from None
        decoders = [op for op in graph.get_ordered_ops() if op.get_type_name() == "VocabDecoder"]
        constants = ([decoders[0].input_value(i).get_node() for i in (1, 2, 3)]
                     if len(decoders) == 1 else [])
        if len(constants) != 3 or any(c.get_type_name() != "Constant" for c in constants):
            raise RefusedError(f"{Path(self.path).name}: its detokenizer has no vocabulary "
                               "constrained decoding can read")
        begins, ends = (c.get_data().astype(np.int64).tolist() for c in constants[:2])
        raw = constants[2].get_data().tobytes()
        tokens = [raw[b:e] for b, e in zip(begins, ends, strict=True)]
        for token in _skipped_tokens(decoders[0], len(tokens)):
            tokens[token] = b"\xff" + tokens[token]
        return tokens

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

    def _graph(self, layout: Layout | None) -> tuple[Any, list[list[str]]]:
        """The base graph with LoRA branches `y += (x·Aᵀ)·Bᵀ`, logits sliced, and its
        branch groups.

        None: a branch on every registered layer, A and B inputs (`lora_a.N`, `lora_b.N`,
        N the layer's `node_index`) of any rank: the prompt graph, which every session
        shares. Otherwise a one-token graph's branches, their ranks fixed by `layout`:
        layers that read the same input (q, k and v; gate and up) share one, x·[A₁;A₂]ᵀ
        then one product with the block-diagonal B, split per layer (inputs `step_a.G`,
        `step_b.G`, G the group's place in the returned list): each of these tiny products
        costs a node's fixed overhead, not arithmetic, so fewer is faster."""
        model = self.base_model.clone()
        by_name = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
        layers = list(self.registered) if layout is None else [n for n, _ in layout]
        for node_name in layers:
            op = by_name.get(node_name)
            if op is None or op.get_type_name() != "MatMul":
                raise EngineError(f"layer {node_name} is not a MatMul of this model")
        params: list[Any] = []

        def branch(names: tuple[str, str], shapes: tuple[list[int], list[int]],
                   on: list[Any]) -> None:
            a, b = (ops.parameter(shape, self.lora_type, name=name)
                    for name, shape in zip(names, shapes, strict=True))
            for param, name in ((a, names[0]), (b, names[1])):
                param.output(0).get_tensor().set_names({name})
            params.extend((a, b))
            _add_branch(on, a, b, self.lora_type)

        groups: list[list[str]] = []
        if layout is None:
            for node_name in layers:
                out_f, in_f = self.registered[node_name]
                index = self.node_index[node_name]
                branch((f"lora_a.{index}", f"lora_b.{index}"), ([-1, in_f], [out_f, -1]),
                       [by_name[node_name]])
        else:
            ranks = dict(layout)
            by_source: dict[tuple[str, int], list[str]] = {}
            for node_name in layers:
                source = by_name[node_name].input_value(0)
                by_source.setdefault((source.get_node().get_name(), source.get_index()),
                                     []).append(node_name)
            groups = list(by_source.values())
            for index, names in enumerate(groups):
                rank = sum(ranks[n] for n in names)
                out_f = sum(self.registered[n][0] for n in names)
                branch((f"step_a.{index}", f"step_b.{index}"),
                       ([rank, self.registered[names[0]][1]], [out_f, rank]),
                       [by_name[n] for n in names])
        self._sliced = _slice_logits(model)
        if params:
            model.add_parameters(params)
        model.validate_nodes_and_infer_types()
        return model, groups

    def _compile_graph(self, model: Any) -> Any:
        """Compile `model` with the profile's settings; refuse a precision the CPU changed."""
        config = compile_config(self.compute, self.n_threads, self.bf16_one_thread)
        try:
            compiled = self.core.compile_model(model, "CPU", config)
        except RuntimeError as exc:
            raise EngineError("OpenVINO could not compile the model",
                              details=(str(exc).strip()[-400:],)) from None
        got = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
        wanted = config["INFERENCE_PRECISION_HINT"]
        groups = str(compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE"))
        if _PRECISION_TYPES[wanted] not in got or groups != config[
                "DYNAMIC_QUANTIZATION_GROUP_SIZE"]:
            raise RefusedError(f"this CPU computes {got} (activation groups {groups}) where "
                               f"the {self.profile_name} profile names {wanted} "
                               f"({config['DYNAMIC_QUANTIZATION_GROUP_SIZE']}); rebuild it "
                               "with `variant-studio model openvino-default`")
        return compiled

    def prepare(self, adapters: tuple[LoadedAdapter, ...], layout: Layout) -> None:
        """Register adapters and compile what a session of them needs and is missing: the
        prompt graph when a new layer needs a branch (every registered layer's, any
        rank), and the one-token graph of the session's `layout` (`stepper`). Two graphs
        are compiled at once, in two threads (OpenVINO releases the GIL): a base's first
        load took 2.6-3.0 s that way against 4.7-5.0 s one after the other."""
        rebuild = self._needs_branches(adapters)
        for adapter in adapters:
            self.adapters.setdefault(adapter.sha256, adapter)
        graphs = {}
        if rebuild:
            for adapter in adapters:
                for node, (a, b) in adapter.layers.items():
                    self.registered[node] = (b.shape[0], a.shape[1])
            self.compiled = self._prompt_request = None
            self.steppers.clear()  # their sessions are closed with the old prompt graph
            self.node_index = {node: i for i, node in enumerate(sorted(self.registered))}
            graphs["prompt"] = self._graph(None)[0]
        groups: list[list[str]] = []
        if self.one_token_graphs and layout not in self.steppers:
            graph, groups = self._graph(layout)
            graph.reshape({**ONE_TOKEN, **({LOGITS_FROM: [1]} if self._sliced else {})})
            graphs["step"] = graph
        if len(graphs) > 1:
            with ThreadPoolExecutor(len(graphs)) as pool:
                futures = {name: pool.submit(self._compile_graph, g) for name, g in
                           graphs.items()}
            compiled = {name: future.result() for name, future in futures.items()}
        else:
            compiled = {name: self._compile_graph(g) for name, g in graphs.items()}
        if "prompt" in compiled:
            self.compiled = compiled["prompt"]
            self.builds += 1
        if "step" in compiled:
            self.steppers[layout] = (compiled["step"], groups)
            while len(self.steppers) > MAX_STEPPERS:
                self.steppers.popitem(last=False)

    def stepper(self, layout: Layout) -> tuple[Any, list[list[str]] | None]:
        """The compiled one-token graph for `layout` and its branch groups, compiled by
        `prepare`; the least recently used of `MAX_STEPPERS` is dropped after another is
        compiled (a session keeps its own alive). Its ranks are static: with inputs of
        dynamic rank a variant ran at 0.84-0.89 of its base, with static ranks at about
        0.95 (docs/performance.md). The exact profile steps on its prompt graph (groups
        None): another copy of its weights would be a GB of f32."""
        if not self.one_token_graphs:
            return self.compiled, None
        self.steppers.move_to_end(layout)
        return self.steppers[layout]

    def prompt_request(self) -> Any:
        """The one request every session decodes prompts with (it starts from an empty
        state each time, so sessions can share it; the engine thread is the only user)."""
        if self._prompt_request is None:
            self._prompt_request = self.compiled.create_infer_request()
        return self._prompt_request

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
        scaled = tuple(zip(loaded, (a.scale for a, _ in adapters), strict=True))
        # Adapters at scale 0 add exactly nothing, so no graph gets their branches (a
        # session of only such adapters runs exactly as the base: rank 0 in the prompt
        # graph, the base's one-token graph). They are registered all the same, so
        # changing a scale does not rebuild the prompt graph.
        branches = _branches(tuple((a, scale) for a, scale in scaled if scale))
        layout = tuple(sorted((node, a.shape[0]) for node, (a, _) in branches.items()))
        self.prepare(loaded, layout)
        return OvContext(self, branches, self.stepper(layout), n_ctx)

    @property
    def profile_name(self) -> str:
        return self.compute.name if self.compute else "exact"

    def details(self) -> dict[str, Any]:
        compiled = {}
        if self.compiled is not None:
            compiled = {k: str(self.compiled.get_property(k)) for k in (
                "INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "INFERENCE_NUM_THREADS",
                "DYNAMIC_QUANTIZATION_GROUP_SIZE")}
        return {"profile": self.compute.label() if self.compute else "exact (f16 @ f32)",
                "compiled": compiled,
                "adapters_loaded": sorted(self.adapters), "pipeline_builds": self.builds,
                "one_token_graphs": len(self.steppers),
                "lora_layers": len(self.registered),
                "adapters_registered": [{"name": a.name, "sha256": sha,
                                         "attached_tensors": a.plan.attached_tensors,
                                         "total_tensors": a.plan.total_tensors}
                                        for sha, a in self.adapters.items()]}

    def unload_adapter(self, sha256: str) -> None:
        """Drop a registered adapter's arrays (no session uses it any more: the live
        contexts keep their own branches). Its layers keep their LoRA branches in the
        prompt graph: removing them would cost a recompile, and rank 0 adds nothing."""
        self.adapters.pop(sha256, None)

    def close(self) -> None:
        self.compiled = self._prompt_request = None
        self.steppers.clear()
        self.adapters.clear()


class OvContext:
    """One session: a one-token request with its own KV state, and its adapter tensors.

    Prompts (and teacher-forced scores) run on the base's shared prompt request, with
    this session's adapter tensors bound first; a prompt's KV state is then moved into
    this session's request, which decodes the answer token by token."""

    def __init__(self, model: OvModel, branches: Branches,
                 stepper: tuple[Any, list[list[str]] | None], n_ctx: int) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.cancelled: Callable[[], bool] = lambda: False
        # The prompt graph's adapter inputs: this session's branches, rank 0 elsewhere.
        self.lora: dict[str, ov.Tensor] = {}
        for node, index in model.node_index.items():
            out_f, in_f = model.registered[node]
            a, b = branches.get(node, (np.zeros((0, in_f), np.float32),
                                       np.zeros((out_f, 0), np.float32)))
            self.lora[f"lora_a.{index}"] = _tensor(a, model.lora_type)
            self.lora[f"lora_b.{index}"] = _tensor(b, model.lora_type)
        compiled, groups = stepper
        self.stepper = compiled  # held here, so it outlives its eviction from the model
        self.request = compiled.create_infer_request()
        # The one-token graph's adapter inputs: per group, the A of its layers stacked,
        # and their B block-diagonal.
        step_inputs = dict(self.lora) if groups is None else {}
        for index, names in enumerate(groups or ()):
            a_cat = np.concatenate([branches[n][0] for n in names], 0)
            b_block = np.zeros((sum(branches[n][1].shape[0] for n in names),
                                a_cat.shape[0]), np.float32)
            row = col = 0
            for n in names:
                b = branches[n][1]
                b_block[row:row + b.shape[0], col:col + b.shape[1]] = b
                row, col = row + b.shape[0], col + b.shape[1]
            step_inputs[f"step_a.{index}"] = _tensor(a_cat, model.lora_type)
            step_inputs[f"step_b.{index}"] = _tensor(b_block, model.lora_type)
        self.tokens: list[int] = []
        self.reused = 0  # every prompt is decoded whole (see `prefill`)
        self._beam = np.zeros(1, np.int32)
        # The one-token step's inputs: views of these buffers, bound once and written in
        # place by `step` (the attention mask, which grows, is bound every step).
        self._ids = np.zeros((1, 1), np.int64)
        self._position = np.zeros((1, 1), np.int64)
        self._ones = np.ones((1, 256), np.int64)  # attention masks are views of it
        fixed = {"input_ids": self._ids, "position_ids": self._position,
                 "beam_idx": self._beam}
        if model._sliced:
            fixed[LOGITS_FROM] = np.zeros(1, np.int64)
        for name, array in fixed.items():
            self.request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        for name, tensor in step_inputs.items():
            self.request.set_tensor(name, tensor)
        self._fixed = fixed  # the buffers stay alive while they are bound

    @property
    def kv_capacity(self) -> int:
        return self.n_ctx  # the stateful KV cache grows by itself

    @property
    def kv_bytes(self) -> int:
        """Memory of the KV state now (keys and values of the cached tokens, at the
        profile's KV-cache precision)."""
        info = self.model.info
        head_dim = info.embedding_length // max(info.head_count, 1)
        compute = self.model.compute
        width = 2 if compute is not None and compute.kv_cache in ("f16", "bf16") else 4
        return len(self.tokens) * info.block_count * 2 * info.head_count_kv * head_dim * width

    def _run(self, tokens: list[int], logits_from: int) -> tuple[Any, np.ndarray]:
        """Decode `tokens` from an empty state on the base's prompt request, with this
        session's adapters; (the request, logits for positions >= logits_from)."""
        if len(tokens) > self.n_ctx:
            raise EngineError(f"context full: {len(tokens)} tokens do not fit in "
                              f"n_ctx={self.n_ctx}")
        if self.cancelled():
            raise Cancelled("cancelled")
        inputs = {
            "input_ids": np.asarray([tokens], np.int64),
            "attention_mask": np.ones((1, len(tokens)), np.int64),
            "position_ids": np.arange(len(tokens), dtype=np.int64)[None],
            "beam_idx": self._beam,
        }
        if self.model._sliced:
            inputs[LOGITS_FROM] = np.asarray([logits_from], np.int64)
        request = self.model.prompt_request()
        request.reset_state()
        # Bound as new tensors (copies), never through `start_async(inputs)`: OpenVINO's
        # input dispatcher would try to reshape a tensor bound earlier in place and fails
        # ("Could set new shape") on a longer input.
        for name, value in inputs.items():
            request.set_tensor(name, ov.Tensor(value))
        for name, tensor in self.lora.items():
            request.set_tensor(name, tensor)
        request.start_async()
        while not request.wait_for(POLL_MS):
            if self.cancelled():
                request.cancel()
                try:
                    request.wait()
                except RuntimeError:
                    pass  # "Infer Request was canceled"
                raise Cancelled("cancelled")
        logits = request.get_tensor("logits").data[0]
        if not self.model._sliced:
            logits = logits[logits_from:]
        return request, np.array(logits, dtype=np.float32)

    def reset(self) -> None:
        self.request.reset_state()
        self.tokens = []

    def prefill(self, prompt: list[int], reserve: int = 0) -> np.ndarray:
        """Logits after `prompt`, computed from an empty state in one pass (the
        stateful KV cache grows by itself, so `reserve` needs nothing here); the prompt's
        KV state then moves into this session's one-token request.

        No prefix is reused: OpenVINO's stateful model cannot drop the tail of its KV
        state, only reset all of it, so an OpenVINO session decodes every prompt whole.
        """
        if not prompt:
            raise EngineError("empty prompt")
        self.reset()
        prompted, logits = self._run(prompt, len(prompt) - 1)
        kv = {state.name: state for state in prompted.query_state()}
        for state in self.request.query_state():
            state.state = kv[state.name].state
        self.tokens = list(prompt)
        return logits[-1]

    def prefill_steps(self, prompt: list[int], reserve: int = 0
                      ) -> Iterator[np.ndarray | None]:
        """`prefill` as one step (see `Context.prefill_steps`)."""
        yield self.prefill(prompt, reserve)

    def step(self, token: int) -> np.ndarray:
        """One token on the one-token graph: the inputs are views of buffers kept by the
        session (no per-token arrays or dicts), and it infers on this thread: a single
        token is short, and handing it to OpenVINO's executor and waiting for it cost
        more than the inference on a busy 2-core machine."""
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
        request = self.request
        request.set_tensor("attention_mask",
                           ov.Tensor(self._ones[:, :past + 1], shared_memory=True))
        request.infer()
        self.tokens.append(token)
        # A copy: the next inference writes into the same output tensor.
        return np.array(request.get_output_tensor(0).data[0, -1], dtype=np.float32)

    def score(self, prompt: list[int], continuation: list[int]) -> list[np.ndarray]:
        """Logits predicting each token of `continuation` after `prompt` (teacher forcing)."""
        if not continuation:
            return []
        self.reset()
        rows = self._run(prompt + continuation[:-1], len(prompt) - 1)[1]
        return list(rows[-len(continuation):])

    def close(self) -> None:
        self.request = self.stepper = None
        self.lora = {}


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


_TOKENIZER_CORE: list[Any] = []


def _tokenizer_core() -> Any:
    """A Core that reads tokenizer graphs: made after openvino_tokenizers registered its
    operations, and kept for the process (a graph of them outliving its Core crashes
    the process when it is freed: the operations' library goes with the Core)."""
    if not _TOKENIZER_CORE:
        import openvino_tokenizers  # noqa: F401  (registers the tokenizer operations)

        _TOKENIZER_CORE.append(ov.Core())
    return _TOKENIZER_CORE[0]


def _skipped_tokens(decoder: Any, n_tokens: int) -> list[int]:
    """The ids a VocabDecoder skips (special tokens): a constant, or a slice of one."""
    if decoder.get_input_size() < 5:
        return []
    node = decoder.input_value(4).get_node()
    if node.get_type_name() == "Constant":
        ids = node.get_data().copy()
    elif node.get_type_name() == "Slice" and all(
            v.get_node().get_type_name() == "Constant" for v in node.input_values()):
        data, start, stop, step, *_ = (v.get_node().get_data().copy()
                                       for v in node.input_values())
        ids = np.asarray(data)[int(start[0]):int(min(stop[0], len(data))):int(step[0])]
    else:
        return []
    return [int(t) for t in np.asarray(ids).ravel() if 0 <= int(t) < n_tokens]


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


def _branches(adapters: tuple[tuple[LoadedAdapter, float], ...]) -> Branches:
    """Per layer the adapters reach: their A (rank × in) and `scale × alpha / rank` · B
    (out × rank), concatenated along the rank in the adapters' order."""
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for adapter, scale in adapters:
        for node, (a, b) in adapter.layers.items():
            a_parts, b_parts = parts.setdefault(node, ([], []))
            a_parts.append(a)
            b_parts.append(b * np.float32(scale * adapter.multiplier_per_scale))
    return {node: (np.concatenate(a, 0), np.concatenate(b, 1))
            for node, (a, b) in parts.items()}


def _add_branch(layers: list[Any], a: Any, b: Any, kind: Any) -> None:
    """`y += (x·Aᵀ)·Bᵀ` on MatMul `layers` that read the same x; with several layers, B's
    rows are theirs in order, and the product is split between them."""
    x = layers[0].input_value(0)
    if x.get_element_type() != kind:
        x = ops.convert(x, kind).output(0)
    delta = ops.matmul(ops.matmul(x, a, False, True), b, False, True)
    sizes = [op.get_output_partial_shape(0)[-1].get_length() for op in layers]
    parts = (ops.variadic_split(delta, -1, sizes).outputs() if len(layers) > 1
             else [delta.output(0)])
    for op, part in zip(layers, parts, strict=True):
        if op.get_output_element_type(0) != kind:
            part = ops.convert(part, op.get_output_element_type(0)).output(0)
        consumers = list(op.output(0).get_target_inputs())
        add = ops.add(op.output(0), part)
        for consumer in consumers:
            consumer.replace_source_output(add.output(0))


def _tensor(array: np.ndarray, kind: Any) -> ov.Tensor:
    """A float32 array as an OpenVINO tensor of `kind` (f32, or bf16 rounded to nearest
    even, the way OpenVINO converts)."""
    array = np.ascontiguousarray(array, np.float32)
    if kind != ov.Type.bf16:
        return ov.Tensor(array)
    bits = array.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    # Written into memory the tensor owns: a tensor made from a numpy array shares that
    # array, which must then outlive every request the tensor is bound to.
    tensor = ov.Tensor(ov.Type.bf16, list(array.shape))
    tensor.data.view(np.uint16)[...] = rounded
    return tensor


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


def compile_config(compute: ComputeProfile | None, n_threads: int,
                   bf16_one_thread: bool = False) -> dict[str, Any]:
    """OpenVINO's compile settings for a profile (None or `exact`: COMPILE_CONFIG)."""
    config = dict(COMPILE_CONFIG, INFERENCE_NUM_THREADS=str(n_threads))
    if compute is not None and compute.name != "exact":
        config["INFERENCE_PRECISION_HINT"] = compute.precision
        config["KV_CACHE_PRECISION"] = compute.kv_cache
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(compute.dynamic_quantization)
        if compute.precision == "bf16" and n_threads == 1 and not bf16_one_thread:
            # OpenVINO 2026.4's CPU plugin died with SIGFPE at bf16 on one thread on one
            # machine (docs/notes.md): two, unless `probe` found one safe here. The
            # thread count moves log-probabilities a little (up to 6e-4 between one and
            # two threads on the demo's 60 held-out answers), not those answers' text.
            config["INFERENCE_NUM_THREADS"] = "2"
    return config


def load_base(path: str, sha256: str, n_threads: int,
              compute: ComputeProfile | None = None) -> OvModel:
    """Load an OpenVINO base: an IR folder, or a GGUF converted once into the cache."""
    from engine.runtime.openvino import build as openvino_build

    source = Path(path)
    folder = source if source.is_dir() else openvino_build.exact_ir_for_gguf(source, sha256)
    info = inspect_path(folder)
    if not isinstance(info, BaseModelInfo):
        raise RefusedError(f"{source.name}: not a base model")
    return OvModel(str(folder), sha256, info, n_threads, compute)

