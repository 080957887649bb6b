"""Session identity: everything that changes what a model computes.

Identity is cache safety. Two sessions may share warm state (KV cache, prefix
cache, a resident context) only if their identities are equal: same backend, same
base bytes, the same adapters in the same order with the same bytes and scales, the
same chat template and BOS policy, the same runtime version and context settings.
The key is a sha256 of canonical JSON, so it is stable across processes.

The names of the base and of each adapter are in the key on purpose, although they
change nothing computed. A session is kept under its key together with the spec it was
opened with, and the engine reports a session's parts by those names (each result's
`adapters`, `describe`); conversations keep the key of every answer to trace it to the
catalog entries that produced it. With names out of the key, a request for one entry
could be served, and reported, as another entry that holds the same bytes. The cost is
small: the same bytes under two names do not share warm state.

Not in the key, because they change nothing computed: the variant's own name, where
the files are and where they came from, when they were added, an adapter's default
scale, and the profile's sampling and system prompt (these travel with each request;
a system prompt reaches the cache as prompt tokens). tests/test_identity.py checks
both lists.

`compute` is the OpenVINO profile a base is served with (docs/formats.md, "Profiles"):
which weights (F16, int8, int4 and their digest) and at what precision OpenVINO computes.
The same base under two profiles computes different numbers, so the profiles have
different keys. It is left out of the canonical form when a backend has no profiles
(llama.cpp, an OpenVINO IR added by the user), so those keys did not change when it came.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from importlib import metadata

RUNTIME_PACKAGES = {"llama": "llama-cpp-python", "openvino": "openvino-genai"}


@functools.cache  # read once per process (4 ms a call, and identity asks it per entry)
def runtime_version(backend: str) -> str:
    package = RUNTIME_PACKAGES[backend]
    try:
        return f"{package}/{metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return f"{package}/missing"


def _canonical_scale(scale: float) -> float:
    if not math.isfinite(scale):
        raise ValueError(f"scale {scale!r} is not finite")
    # -0.0 and 0.0 compute the same thing and must give the same key.
    return float(scale) + 0.0


@dataclass(frozen=True)
class AdapterRef:
    name: str
    sha256: str
    scale: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _canonical_scale(self.scale))


@dataclass(frozen=True)
class ContextConfig:
    """The context a session runs with. `n_batch` is the chunk size prompts are decoded
    in, aligned to absolute positions (it changes llama.cpp's numerics, hence the
    identity; see `engine.runtime.llama.backend.LlamaContext`)."""

    n_ctx: int = 4096
    n_batch: int = 64

    def __post_init__(self) -> None:
        if not 256 <= self.n_ctx <= 1 << 20:
            raise ValueError(f"context size {self.n_ctx} out of range (256..1048576)")
        if not 1 <= self.n_batch <= 1 << 16:
            raise ValueError(f"batch size {self.n_batch} out of range")


# The OpenVINO profiles a base built by us is served with (docs/formats.md, "Profiles"),
# and the one serving takes unless told otherwise. The one list every room uses.
OPENVINO_PROFILES = ("fast", "fast-int8", "exact")
DEFAULT_OPENVINO_PROFILE = "fast"


@dataclass(frozen=True)
class ComputeProfile:
    """How an OpenVINO base computes: its named profile, weights and precisions."""

    name: str  # "fast", "fast-int8" or "exact"
    weights: str  # "int4", "int8" or "f16"
    precision: str  # INFERENCE_PRECISION_HINT: "f32" or "bf16"
    kv_cache: str  # KV_CACHE_PRECISION: "f32" or "f16"
    weights_sha256: str  # digest of the IR folder served (the base's own for "exact")
    # DYNAMIC_QUANTIZATION_GROUP_SIZE: activations quantized to int8 in groups of this
    # many (0: float activations; left out of the key then, so older keys stay).
    dynamic_quantization: int = 0

    def label(self) -> str:
        """A short label for a library row or a report: `fast (int4 @ f32)`,
        `fast-int8 (int8 @ f32, int8 activations)`."""
        extra = ", int8 activations" if self.dynamic_quantization else ""
        return f"{self.name} ({self.weights} @ {self.precision}{extra})"


@dataclass(frozen=True)
class Identity:
    backend: str
    base_name: str
    base_sha256: str
    adapters: tuple[AdapterRef, ...]
    chat_template_sha256: str | None
    bos_policy: str
    runtime: str
    context: ContextConfig
    compute: ComputeProfile | None = None

    def canonical(self) -> str:
        data = _without_defaults(asdict(self))
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @property
    def served_sha256(self) -> str:
        """The digest of the weights actually served (a profile's folder, else the base)."""
        return self.compute.weights_sha256 if self.compute else self.base_sha256

    @property
    def key(self) -> str:
        return hashlib.sha256(self.canonical().encode("ascii")).hexdigest()

    @property
    def short(self) -> str:
        return self.key[:12]

    def base_only(self) -> Identity:
        """The identity of this variant's base, with nothing else changed."""
        return Identity(self.backend, self.base_name, self.base_sha256, (),
                        self.chat_template_sha256, self.bos_policy, self.runtime,
                        self.context, self.compute)

    def to_dict(self) -> dict:
        data = _without_defaults(asdict(self))
        data["key"] = self.key
        return data

    @staticmethod
    def from_dict(data: dict) -> Identity:
        return Identity(
            backend=data["backend"],
            base_name=data["base_name"],
            base_sha256=data["base_sha256"],
            adapters=tuple(AdapterRef(**a) for a in data["adapters"]),
            chat_template_sha256=data["chat_template_sha256"],
            bos_policy=data["bos_policy"],
            runtime=data["runtime"],
            context=ContextConfig(**data["context"]),
            compute=ComputeProfile(**data["compute"]) if data.get("compute") else None,
        )


def _without_defaults(data: dict) -> dict:
    """An identity's fields without those added later at their "off" values, so the keys
    made before them do not change: no `compute` (no profiles on this backend), no
    `compute.dynamic_quantization` (float activations)."""
    if data["compute"] is None:
        del data["compute"]
    elif not data["compute"]["dynamic_quantization"]:
        del data["compute"]["dynamic_quantization"]
    return data
