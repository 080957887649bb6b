"""What an export target is: the one interface the export command calls through.

Each target module (`llama_server`, `vllm`, `ovms`) provides one object implementing
`Target`, registered in `engine.export.TARGETS` under its name. Its options are a frozen
dataclass of its own flags, every field defaulted (an export without options is the
target's plain export). `options_from` builds them from the command line's parsed
arguments and refuses a flag that belongs to another target, so no caller needs to
know which flag goes with which target.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from engine.catalog.store import Catalog
from engine.errors import UsageError
from engine.export.common import Plan, Progress

OptionsT = TypeVar("OptionsT")


class Target(Protocol[OptionsT]):
    """One server engine an export is written for."""

    name: str  # the value of --target, and the manifest's "target"
    capability: str  # what the base must support (formats.capabilities), asked first
    options_type: type[OptionsT]  # a frozen dataclass; its defaults are the plain export

    def options_from(self, args: argparse.Namespace) -> OptionsT:
        """The options from the export command's arguments; a flag of another target is
        a `UsageError` (nothing has been read or written yet)."""
        ...

    def write(self, catalog: Catalog, plan: Plan, folder: Path, options: OptionsT,
              progress: Progress | None) -> dict[str, Any]:
        """Write the target's files into `folder` (a fresh staging folder); returns the
        manifest's target-specific parts: base, adapters and serve (and lora or merge)."""
        ...


@dataclass(frozen=True)
class Flags:
    """Flags of the export command that only one target takes: their argparse
    destinations, and the one line that refuses them with any other target."""

    owner: str
    dests: tuple[str, ...]
    refusal: str


# In this order: when flags of two targets are misplaced at once, the first is reported.
TARGET_FLAGS = (
    Flags("llama-server", ("copy_base",),
          "--copy-base is for --target llama-server (the vLLM export always holds the base, "
          "converted; the OVMS export the merged model)"),
    Flags("ovms", ("merge_type", "eval_rows", "task_rows"),
          "--merge-type, --eval-rows and --task-rows are for --target ovms (the other "
          "exports keep the adapters as adapters)"),
)


def refuse_other_flags(args: argparse.Namespace, target: str) -> None:
    """Refuse any flag given in `args` that belongs to a target other than `target`.

    A flag counts as given when its value is not its unset one (None, or False for a
    switch), compared by identity: `--task-rows 0` is given, though 0 == False."""
    for flags in TARGET_FLAGS:
        if flags.owner == target:
            continue
        for dest in flags.dests:
            value = getattr(args, dest, None)
            if value is not None and value is not False:
                raise UsageError(flags.refusal)
