"""What this CPU runs best: the compressed profiles' precision, and the serving profile.

Precision. Where the CPU has native bf16, OpenVINO's CPU plugin defaults to it, but bf16 is
not always the better choice: on an AVX-512 BF16 Zen 4 a compressed profile decoded about
1.2x faster at bf16 than at f32 on one thread, on a Zen 5 no faster (docs/notes.md),
and OpenVINO 2026.4 died with SIGFPE at bf16 on one thread on a third VM of this kind.
Python cannot catch the signal, and it would take the engine down with every request, so
the question is asked once per CPU and OpenVINO version, in a child process that compiles
a profile's IR on one thread at f32 and then at bf16, and times the one-token steps of
each after a prompt. bf16 is chosen only where the child survived it with finite logits
and it was clearly faster (`BF16_MARGIN`); f32 otherwise, the safe side. A record made
earlier at bf16 still runs at bf16, on two threads unless one is known to be safe
(`backend.compile_config`).

Serving profile. Which of `fast` (int4 on OpenVINO's float kernels) and `fast-int8` (int8
with integer zero points, activations quantized to int8: the integer kernels) steps
faster depends on the CPU (on a Zen 5 int8 ran 1.19x int4; on an AVX2 Zen 3 without
integer dot-product instructions the two were level), so it is measured too: a child
compiles both one-token graphs at the chosen precision on one thread and times their
steps back to back, in alternating order, for `PROFILE_ROUNDS` rounds. What decides is
the median of the rounds' speed ratios (two runs seconds apart share the machine's load,
which on these VMs moves absolute speeds by 1.6x). `fast-int8` is the default unless
`fast` steps at least `PROFILE_MARGIN` (10 %) faster: it is also the closer of the two
to llama.cpp (docs/formats.md, "Profiles"), so a tie goes to it, and a margin twice the
rounds' spread keeps a tie from flipping between measurements (on the Zen 3 three runs
gave ratios of 0.98, 1.03 and 1.08). A crash or a failed child
keeps `fast`, the default before any measurement. (Whether `fast` is a candidate at all,
because its int4 codes are the file's own, is `models.default_profile`'s question.)

Both answers are kept in the OpenVINO build cache (`probes.json`), per CPU (model name,
family, AVX-512/AMX flags) and OpenVINO version; the serving profile also per precision
and model size (`size_class`: within a factor of two).

Any process (the window's registers the default): OpenVINO is imported by the child only,
this module's `main`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.runtime.openvino.build import cache_root, openvino_version
from engine.state.statefile import write_json_atomic

PROBES = "probes.json"
TIMEOUT_S = 300
PROMPT_TOKENS = 96
STEPS = 16  # timed one-token steps per round, after two untimed ones
ROUNDS = 3  # f32 and bf16 alternate; each keeps its fastest round
PROFILE_ROUNDS = 7  # fast and fast-int8 back to back, order alternating (noise: notes.md)
BF16_MARGIN = 1.05  # bf16 must decode this much faster to be chosen over f32
PROFILE_MARGIN = 1.10  # fast (int4) must step this much faster than fast-int8 to be chosen
FAST, FAST_INT8 = "fast", "fast-int8"
RATIO = "fast/fast-int8"  # the median of the rounds' speed ratios, what the rule reads


@dataclass(frozen=True)
class Probe:
    """What the child found: bf16 on one thread ran (finite logits, no crash), the
    precision chosen, and the one-thread tokens/s measured at each precision it ran."""

    bf16_one_thread: bool
    precision: str
    tokens_per_second: dict[str, float]


def machine_key() -> str:
    """The CPU's model name and flags, and the OpenVINO version: what the answer depends on."""
    model = flags = ""
    family = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "cpu family" and not family:
                family = value.strip()  # "AMD EPYC" names Zen 4 and Zen 5 alike
            elif key.strip() == "flags" and not flags:
                flags = " ".join(sorted(f for f in value.split() if "avx512" in f or "amx" in f))
    except OSError:
        pass
    return f"{model or 'unknown cpu'} family {family} [{flags}] openvino {openvino_version()}"


def native_bf16() -> bool:
    """OpenVINO's own default precision for this CPU is bf16 (native bf16 arithmetic)."""
    import openvino as ov

    # The property is an `ov.Type`, whose str is "<Type: 'bfloat16'>" (never "bf16").
    hint = str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))
    return "bfloat16" in hint or "bf16" in hint


def ask(ir_folder: Path) -> Probe:
    """The kept answer for this machine, or the child's (then kept)."""
    path, known = _kept()
    key = machine_key()
    try:
        return Probe(**known[key])
    except (KeyError, TypeError):
        pass  # not asked yet here (or kept by an older version): ask
    try:
        child = subprocess.run([sys.executable, "-m", __name__, str(ir_folder)],
                               capture_output=True, text=True, timeout=TIMEOUT_S,
                               check=False)
    except (OSError, subprocess.TimeoutExpired):
        return Probe(False, "f32", {})  # not known: ask again next time
    found = _answer(child.returncode, child.stdout)
    known[key] = asdict(found)
    write_json_atomic(path, known)
    return found


def _last_figures(stdout: str, keys: tuple[str, ...]) -> dict[str, float]:
    """The `keys` of the child's last JSON object line, as floats."""
    figures: dict[str, float] = {}
    for line in stdout.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            figures = {k: float(v) for k, v in data.items() if k in keys}
    return figures


def _answer(returncode: int, stdout: str) -> Probe:
    """From the child's last JSON line (tokens/s per precision; none where the CPU has no
    native bf16); a crash or no bf16: f32."""
    speeds = _last_figures(stdout, ("f32", "bf16"))
    ok = returncode == 0 and "bf16" in speeds and "f32" in speeds
    faster = ok and speeds["bf16"] >= BF16_MARGIN * speeds["f32"]
    return Probe(ok, "bf16" if faster else "f32", speeds)


@dataclass(frozen=True)
class ProfileProbe:
    """The serving profile chosen and the one-thread one-token tokens/s of each (empty
    when the child failed)."""

    profile: str
    tokens_per_second: dict[str, float]


def _kept() -> tuple[Path, dict]:
    path = cache_root() / PROBES
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    return path, known if isinstance(known, dict) else {}


def preferred_profile(fast_ir: Path, int8_ir: Path, precision: str) -> ProfileProbe:
    """The serving profile for this CPU: the kept answer, or the child's (then kept).

    `fast_ir` and `int8_ir` are the two profiles' IR folders, compiled at `precision`
    (each with the activation quantization its profile names)."""
    path, known = _kept()
    key = f"{machine_key()} serving profile at {precision}, {size_class(fast_ir)}"
    try:
        return ProfileProbe(**known[key])
    except (KeyError, TypeError):
        pass
    try:
        child = subprocess.run([sys.executable, "-m", __name__, "profile", str(fast_ir),
                                str(int8_ir), precision], capture_output=True, text=True,
                               timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ProfileProbe(FAST, {})  # not known: ask again next time
    found = _profile_answer(child.returncode, child.stdout)
    known[key] = asdict(found)
    write_json_atomic(path, known)
    return found


def size_class(ir_folder: Path) -> str:
    """The model's size to within a factor of two (its int4 weights file): int4 halves
    the bytes int8 streams per token, so a model large enough to be bound by memory
    bandwidth may prefer int4 where a small one prefers int8's integer kernels."""
    try:
        size = (Path(ir_folder) / "openvino_model.bin").stat().st_size
    except OSError:
        size = 0
    return f"int4 weights ~2^{round(math.log2(max(size, 1) / 2**20))} MiB"


def _profile_answer(returncode: int, stdout: str) -> ProfileProbe:
    """From the child's last JSON line (median tokens/s of each profile and the median
    of the rounds' fast/fast-int8 ratios); a failed child or a missing figure: `fast`."""
    speeds = _last_figures(stdout, (FAST, FAST_INT8, RATIO))
    if returncode != 0 or not {FAST, FAST_INT8, RATIO} <= set(speeds):
        return ProfileProbe(FAST, speeds)
    faster = speeds[RATIO] >= PROFILE_MARGIN
    return ProfileProbe(FAST if faster else FAST_INT8, speeds)


def bf16_one_thread_ok(ir_folder: Path) -> bool:
    return ask(ir_folder).bf16_one_thread


def preferred_precision(ir_folder: Path) -> str:
    """The precision a compressed profile of this machine computes at ("f32" or "bf16")."""
    return ask(ir_folder).precision


def _one_token_requests(core: Any, folder: Path, config: dict[str, str]) -> tuple[Any, Any]:
    """A prompt request and a one-token request of the IR in `folder`."""
    model = core.read_model(str(folder / "openvino_model.xml"))
    one_token = model.clone()
    one_token.reshape({"input_ids": [1, 1], "position_ids": [1, 1],
                       "attention_mask": [1, -1], "beam_idx": [1]})
    return (core.compile_model(model, "CPU", config).create_infer_request(),
            core.compile_model(one_token, "CPU", config).create_infer_request())


def _time_steps(prompt: Any, step: Any) -> float | None:
    """Tokens/s of `STEPS` one-token steps after a `PROMPT_TOKENS` prompt (None: the
    logits were not finite)."""
    import numpy as np

    n = PROMPT_TOKENS
    prompt.reset_state()
    prompt.infer({"input_ids": (np.arange(n, dtype=np.int64)[None] * 37) % 1000 + 10,
                  "attention_mask": np.ones((1, n), np.int64),
                  "position_ids": np.arange(n, dtype=np.int64)[None],
                  "beam_idx": np.zeros(1, np.int32)})
    kv_state = {state.name: state for state in prompt.query_state()}
    for state in step.query_state():
        state.state = kv_state[state.name].state
    started = 0.0
    for index, position in enumerate(range(n, n + 2 + STEPS)):
        if index == 2:
            started = time.perf_counter()
        step.infer({"input_ids": np.array([[11]], np.int64),
                    "attention_mask": np.ones((1, position + 1), np.int64),
                    "position_ids": np.array([[position]], np.int64),
                    "beam_idx": np.zeros(1, np.int32)})
    if not np.isfinite(step.get_output_tensor(0).data).all():
        return None
    return STEPS / (time.perf_counter() - started)


def _config(precision: str, dynamic_quantization: int) -> dict[str, str]:
    return {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": "f16",
            "INFERENCE_NUM_THREADS": "1", "NUM_STREAMS": "1",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(dynamic_quantization)}


def main(argv: list[str]) -> int:
    """The child. `IR`: time one-token steps of the IR at f32, then bf16, on one thread,
    printing the speeds so far after each round (a crash keeps what came before); where
    the CPU has no native bf16, nothing to time. `profile FAST_IR INT8_IR PRECISION`:
    time the two serving profiles' steps the same way, in alternation (odd rounds in
    reverse order, so neither always runs first)."""
    import openvino as ov

    if argv and argv[0] == "profile":
        return _profile_main(Path(argv[1]), Path(argv[2]), argv[3])
    if not native_bf16():
        print(json.dumps({}), flush=True)
        return 0
    core = ov.Core()
    requests = {precision: _one_token_requests(core, Path(argv[0]), _config(precision, 0))
                for precision in ("f32", "bf16")}
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for precision, (prompt, step) in requests.items():
            speed = _time_steps(prompt, step)
            if speed is None:
                return 1
            best[precision] = max(best.get(precision, 0.0), speed)
            print(json.dumps(best), flush=True)
    return 0


def _profile_main(fast_ir: Path, int8_ir: Path, precision: str) -> int:
    import statistics

    import openvino as ov

    # The profiles' own activation quantization (compress.DYNAMIC_QUANTIZATION); the
    # numbers are repeated here so that the child imports nothing but OpenVINO.
    core = ov.Core()
    requests = {FAST: _one_token_requests(core, fast_ir, _config(precision, 0)),
                FAST_INT8: _one_token_requests(core, int8_ir, _config(precision, 32))}
    order = list(requests)
    speeds: dict[str, list[float]] = {name: [] for name in order}
    ratios: list[float] = []
    for round_ in range(PROFILE_ROUNDS):
        for name in order if round_ % 2 == 0 else order[::-1]:
            speed = _time_steps(*requests[name])
            if speed is None:
                return 1
            speeds[name].append(speed)
        # The two ran back to back: their ratio is what the machine's load spares.
        ratios.append(speeds[FAST][-1] / speeds[FAST_INT8][-1])
        print(json.dumps({**{name: statistics.median(found) for name, found in
                             speeds.items()}, RATIO: statistics.median(ratios)}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
