"""The OpenVINO IR scanner and which IR layer each PEFT adapter tensor attaches to.

The IR's XML is read here, and only here, with a bounded streaming parser
(`scan_matmuls`); artifact inspection and the attach plan both use it.

OpenVINO GenAI (2026.4, `src/cpp/src/lora/adapter.cpp`) decides where a LoRA tensor
goes by name alone and only prints "There unused LoRA tensors" on stderr when a tensor
goes nowhere. We replicate its rule here, before OpenVINO sees the adapter, and add
the shape check it lacks:

- a tensor is an A half if its name matches `(.*)[_.](lora[_.](A|down)\\.weight)` (or
  `(.*lora[12])\\.down\\.weight`), a B half likewise with `B|up`; anything else is
  ignored by OpenVINO;
- for language models the layer key must start with `base_model.model.`, which is
  removed; keys without it are silently ignored (not even reported as unused);
- each MatMul takes the first key (in sorted order) that is a substring of its
  friendly name, or of that name with '.' replaced by '_';
- we then require A to be (rank, in) and B (out, rank) for that MatMul's (out, in).

The engine's OpenVINO backend inserts LoRA exactly where this plan says, so what
validation reports is what runs. No OpenVINO import here: the model XML is parsed
with bounded, streaming reads.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine.errors import InspectionError
from engine.formats import safetensors_file
from engine.formats.safeio import open_regular, printable, stat_regular

PREFIX = "base_model.model."
MAX_XML_BYTES = 256 << 20
_A = re.compile(r"((.*)[_.](lora[_.](A|down)\.weight))|((.*lora[12])\.(down\.weight))")
_B = re.compile(r"((.*)[_.](lora[_.](B|up)\.weight))|((.*lora[12])\.(up\.weight))")


@dataclass(frozen=True)
class MatMulLayer:
    name: str  # friendly name in the IR
    out_features: int | None  # None: no static 2-D weight (an activation product)
    in_features: int | None


@dataclass(frozen=True)
class Attachment:
    key: str  # layer key without the prefix, e.g. model.layers.0.self_attn.q_proj
    node: str  # the MatMul's friendly name
    out_features: int
    in_features: int
    rank: int


@dataclass(frozen=True)
class AttachPlan:
    total_tensors: int
    attached_tensors: int
    attachments: tuple[Attachment, ...]
    unused: tuple[str, ...]  # tensor names that reach no layer
    bad_shapes: tuple[str, ...]  # one line per layer the adapter does not fit

    @property
    def ok(self) -> bool:
        return self.attached_tensors > 0 and not self.bad_shapes

    @property
    def layers(self) -> int:
        return len({a.node for a in self.attachments})

    def coverage(self) -> str:
        return (f"{self.attached_tensors} of {self.total_tensors} tensors attach to "
                f"{self.layers} OpenVINO layers")

    def to_dict(self) -> dict:
        return {"total_tensors": self.total_tensors, "attached_tensors": self.attached_tensors,
                "layers": self.layers, "unused": list(self.unused[:20]),
                "unused_count": len(self.unused), "bad_shapes": list(self.bad_shapes[:20])}


def split_name(name: str) -> tuple[str, str] | None:
    """('A'|'B', layer key with prefix) for a LoRA half, as OpenVINO parses it."""
    for half, pattern in (("A", _A), ("B", _B)):
        match = pattern.fullmatch(name)
        if match:
            return half, match.group(2) if match.group(2) is not None else match.group(6)
    return None


def plan(tensors: dict[str, tuple[int, ...]], matmuls: tuple[MatMulLayer, ...]) -> AttachPlan:
    """Where each tensor of an adapter (name -> numpy-order shape) attaches."""
    halves: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    unused: list[str] = []
    for name, shape in tensors.items():
        parsed = split_name(name)
        if parsed is None or not parsed[1].startswith(PREFIX):
            unused.append(name)
            continue
        half, key = parsed
        halves.setdefault(key.removeprefix(PREFIX), {})[half] = (name, shape)
    keys = sorted(k for k, parts in halves.items() if "A" in parts and "B" in parts)
    for key, parts in halves.items():
        if key not in keys:
            unused.extend(n for n, _ in parts.values())
    used: set[str] = set()
    attachments: list[Attachment] = []
    bad: list[str] = []
    for layer in matmuls:
        variants = (layer.name, layer.name.replace(".", "_"))
        key = next((k for k in keys if any(k in v for v in variants)), None)
        if key is None:
            continue
        used.add(key)
        (_, a_shape), (_, b_shape) = halves[key]["A"], halves[key]["B"]
        if layer.out_features is None or layer.in_features is None:
            bad.append(f"{printable(key)} lands on {printable(layer.name)}, which has no "
                       "2-D weight")
            continue
        if (len(a_shape) != 2 or len(b_shape) != 2 or a_shape[1] != layer.in_features
                or b_shape[0] != layer.out_features or a_shape[0] != b_shape[1]):
            bad.append(f"{printable(key)}: layer {printable(layer.name)} is "
                       f"{layer.out_features}x{layer.in_features}, A {list(a_shape)}, "
                       f"B {list(b_shape)}")
            continue
        attachments.append(Attachment(key, layer.name, layer.out_features,
                                      layer.in_features, int(a_shape[0])))
    for key in keys:
        if key not in used:
            unused.extend(n for n, _ in halves[key].values())
    fitted = {a.key for a in attachments}
    attached = sum(len(halves[k]) for k in fitted)
    return AttachPlan(len(tensors), attached, tuple(attachments), tuple(sorted(unused)),
                      tuple(bad))


def plan_for(adapter: Path, model_folder: Path) -> AttachPlan:
    """The attach plan of a PEFT safetensors file on an OpenVINO IR folder."""
    header = safetensors_file.read_header(adapter)
    shapes = {name: t.shape for name, t in header.tensors.items()}
    return plan(shapes, scan_matmuls(Path(model_folder) / "openvino_model.xml"))


def scan_matmuls(xml: Path) -> tuple[MatMulLayer, ...]:
    """Every MatMul in an IR's XML with its (out, in) weight shape where it has one."""
    st = stat_regular(xml)
    return _scan(str(xml), st.size, st.mtime_ns, st.inode)


@lru_cache(maxsize=8)
def _scan(path: str, size: int, mtime_ns: int, inode: int) -> tuple[MatMulLayer, ...]:
    if size > MAX_XML_BYTES:
        raise InspectionError(f"{Path(path).name}: model XML larger than {MAX_XML_BYTES} bytes")
    handle, _ = open_regular(Path(path))
    found: list[MatMulLayer] = []
    with handle:
        try:
            for _, elem in ElementTree.iterparse(handle, events=("end",)):
                if elem.tag != "layer":
                    continue
                if elem.get("type") == "MatMul":
                    found.append(_layer(elem))
                elem.clear()
        except ElementTree.ParseError as exc:
            raise InspectionError(f"{Path(path).name}: malformed model XML ({exc})") from None
    return tuple(found)


def _layer(elem: ElementTree.Element) -> MatMulLayer:
    name = elem.get("name", "")
    data = elem.find("data")
    transpose_b = data is not None and data.get("transpose_b") == "true"
    ports = elem.findall("input/port")
    if len(ports) != 2:
        return MatMulLayer(name, None, None)
    try:
        dims = [int(d.text or "-1") for d in ports[1].findall("dim")]
    except ValueError:
        return MatMulLayer(name, None, None)
    if len(dims) != 2 or min(dims) <= 0:
        return MatMulLayer(name, None, None)
    out_f, in_f = (dims[0], dims[1]) if transpose_b else (dims[1], dims[0])
    return MatMulLayer(name, out_f, in_f)
