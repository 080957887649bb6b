"""Whether OpenVINO's CPU plugin survives bf16 on one inference thread on this machine.

OpenVINO 2026.4 died with SIGFPE at bf16 with one thread on one VM of this project's kind
(docs/notes.md) and ran well on another (where one thread at bf16 decodes about 1.3x
faster than at f32). Python cannot catch the signal, and it would take the engine down
with every request, so the question is asked once per CPU and OpenVINO version, in a
child process that compiles the profile's IR at bf16 on one thread and decodes a prompt
and a few tokens on both the prompt and the one-token graphs. The answer is kept in
the OpenVINO build cache (`probes.json`); until it is known to be safe, a bf16 profile
asked for one thread gets two (`backend.compile_config`).

Engine process only (OpenVINO is imported by the child, which is this module's `main`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.runtime.openvino.build import cache_root, openvino_version
from engine.state.statefile import write_json_atomic

PROBES = "probes.json"
TIMEOUT_S = 300
PROMPT_TOKENS = 96
STEPS = 4


def machine_key() -> str:
    """The CPU's model name and flags, and the OpenVINO version: what the answer depends on."""
    model = flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = " ".join(sorted(f for f in value.split() if "avx512" in f or "amx" in f))
    except OSError:
        pass
    return f"{model or 'unknown cpu'} [{flags}] openvino {openvino_version()}"


def bf16_one_thread_ok(ir_folder: Path) -> bool:
    """The kept answer for this machine, or the child's (then kept)."""
    path = cache_root() / PROBES
    key = machine_key()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(key), bool):
        return known[key]
    try:
        child = subprocess.run([sys.executable, "-m", __name__, str(ir_folder)],
                               capture_output=True, timeout=TIMEOUT_S, check=False)
        ok = child.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False  # not known: ask again next time
    known[key] = ok
    write_json_atomic(path, known)
    return ok


def main(argv: list[str]) -> int:
    """The child: compile `argv[0]` at bf16 on one thread and decode with it."""
    import numpy as np
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "f16",
              "INFERENCE_NUM_THREADS": "1", "NUM_STREAMS": "1",
              "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    core = ov.Core()
    model = core.read_model(str(Path(argv[0]) / "openvino_model.xml"))
    one_token = model.clone()
    one_token.reshape({"input_ids": [1, 1], "position_ids": [1, 1],
                       "attention_mask": [1, -1], "beam_idx": [1]})
    prompt = core.compile_model(model, "CPU", config).create_infer_request()
    step = core.compile_model(one_token, "CPU", config).create_infer_request()
    n = PROMPT_TOKENS
    prompt.infer({"input_ids": (np.arange(n, dtype=np.int64)[None] * 37) % 1000 + 10,
                  "attention_mask": np.ones((1, n), np.int64),
                  "position_ids": np.arange(n, dtype=np.int64)[None],
                  "beam_idx": np.zeros(1, np.int32)})
    kv = {state.name: state for state in prompt.query_state()}
    for state in step.query_state():
        state.state = kv[state.name].state
    for position in range(n, n + STEPS):
        step.infer({"input_ids": np.array([[11]], np.int64),
                    "attention_mask": np.ones((1, position + 1), np.int64),
                    "position_ids": np.array([[position]], np.int64),
                    "beam_idx": np.zeros(1, np.int32)})
    return 0 if np.isfinite(step.get_output_tensor(0).data).all() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
