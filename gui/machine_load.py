"""The status bar's note when other programs slow the engine.

The engine measures, while it decodes, how much CPU other programs take from the cores
it runs on (`engine.runtime.contention`) and says so in each answer's `machine_load`;
this module words that for the window. It is text only, so it is tested without a
window.
"""

from __future__ import annotations

from engine.runtime.results import CompareResult, GenerationResult, MachineLoad


def load_of(result: object) -> MachineLoad | None:
    """The machine load an answer or a comparison reports (None: not slowed)."""
    if isinstance(result, GenerationResult):
        return result.machine_load
    if isinstance(result, CompareResult):
        # The variant side ran last: the more recent figure.
        return result.variant.machine_load or result.base.machine_load
    return None


def note(load: MachineLoad) -> tuple[str, str]:
    """The status bar's short text and its tooltip for `load`."""
    busy = (f"Other programs were using {load.other_cores:.1f} of this machine's "
            f"{load.cpus} CPU cores while the engine wrote the last answer.")
    if load.threads < load.max_threads:
        text = f"busy machine: {load.threads} of {load.max_threads} threads"
        why = (f" The engine decoded on {load.threads} of its {load.max_threads} threads "
               "meanwhile: threads that share a taken core wait on each other and "
               "decode many times slower than one thread alone. It goes back to "
               "every core once they are free.")
    else:
        text = "busy machine: slowed"
        why = (f" The engine kept its {load.max_threads} threads (Settings → Engine "
               "threads), which decode much slower while a core is taken; 0 (automatic) "
               "lets the engine use fewer threads while the machine is busy.")
    return text, busy + why
