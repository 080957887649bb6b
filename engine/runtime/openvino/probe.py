"""Which precision the compressed OpenVINO profiles compute at on this machine.

Where the CPU has native bf16, OpenVINO's CPU plugin defaults to it, but bf16 is not
always the better choice: on an AVX-512 BF16 Zen 4 a compressed profile decoded about 1.2x
faster at bf16 than at f32 on one thread, on a Zen 5 no faster (docs/notes.md),
and OpenVINO 2026.4 died with SIGFPE at bf16 on one thread on a third VM of this kind.
Python cannot catch the signal, and it would take the engine down with every request, so
the question is asked once per CPU and OpenVINO version, in a child process that compiles
a profile's IR on one thread at f32 and then at bf16, and times the one-token steps of
each after a prompt. bf16 is chosen only where the child survived it with finite logits
and it was clearly faster (`BF16_MARGIN`); f32 otherwise, the safe side. The answer is kept
in the OpenVINO build cache (`probes.json`). A record made earlier at bf16 still runs at
bf16, on two threads unless one is known to be safe (`backend.compile_config`).

Any process (the window's registers the default): OpenVINO is imported by the child only,
this module's `main`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.runtime.openvino.build import cache_root, openvino_version
from engine.state.statefile import write_json_atomic

PROBES = "probes.json"
TIMEOUT_S = 300
PROMPT_TOKENS = 96
STEPS = 16  # timed one-token steps per round, after two untimed ones
ROUNDS = 3  # f32 and bf16 alternate; each keeps its fastest round
BF16_MARGIN = 1.05  # bf16 must decode this much faster to be chosen over f32


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
    path = cache_root() / PROBES
    key = machine_key()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
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


def _answer(returncode: int, stdout: str) -> Probe:
    """From the child's last JSON line (tokens/s per precision; none where the CPU has no
    native bf16); a crash or no bf16: f32."""
    speeds: dict[str, float] = {}
    for line in stdout.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            speeds = {k: float(v) for k, v in data.items() if k in ("f32", "bf16")}
    ok = returncode == 0 and "bf16" in speeds and "f32" in speeds
    faster = ok and speeds["bf16"] >= BF16_MARGIN * speeds["f32"]
    return Probe(ok, "bf16" if faster else "f32", speeds)


def bf16_one_thread_ok(ir_folder: Path) -> bool:
    return ask(ir_folder).bf16_one_thread


def preferred_precision(ir_folder: Path) -> str:
    """The precision a compressed profile of this machine computes at ("f32" or "bf16")."""
    return ask(ir_folder).precision


def main(argv: list[str]) -> int:
    """The child: time one-token steps of the IR at `argv[0]` at f32, then bf16, on one
    thread, printing the speeds so far after each round (a crash keeps what came before);
    where the CPU has no native bf16, nothing to time."""
    import numpy as np
    import openvino as ov

    if not native_bf16():
        print(json.dumps({}), flush=True)
        return 0
    core = ov.Core()
    model = core.read_model(str(Path(argv[0]) / "openvino_model.xml"))
    one_token = model.clone()
    one_token.reshape({"input_ids": [1, 1], "position_ids": [1, 1],
                       "attention_mask": [1, -1], "beam_idx": [1]})
    requests = {}
    for precision, kv in (("f32", "f16"), ("bf16", "f16")):
        config = {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": kv,
                  "INFERENCE_NUM_THREADS": "1", "NUM_STREAMS": "1",
                  "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
        requests[precision] = (core.compile_model(model, "CPU", config).create_infer_request(),
                               core.compile_model(one_token, "CPU", config).create_infer_request())
    n = PROMPT_TOKENS
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for precision, (prompt, step) in requests.items():
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
                return 1
            speed = STEPS / (time.perf_counter() - started)
            best[precision] = max(best.get(precision, 0.0), speed)
            print(json.dumps(best), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
