"""The `variant-studio` command line: a front end over the engine library.

Every error prints one line `error: ...` on stderr (the traceback only with
`--debug`) and exits 2 for usage, 3 for a refused artifact or failed validation,
4 for an unknown name. Read-only commands (`list`, `show`, `status`, `doctor`) work
on `setup.preview` and write nothing; every other command first runs the first-run
set-up (`setup.first_run`) where the state it changes is first needed. The desktop
app is found through the `variant_studio.frontends` entry point, so the library never
imports `gui`.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata

from engine.catalog import digest
from engine.catalog.store import Catalog
from engine.cli import (
    catalog_cmds,
    export_cmds,
    health_cmds,
    lineage_cmds,
    merge_cmds,
    run_cmds,
    score_cmds,
    serve_cmds,
    train_cmds,
    trust_cmds,
)
from engine.cli.parser import build_parser
from engine.curated import setup
from engine.errors import Cancelled, StudioError, UsageError
from engine.state import statefile

Command = Callable[[Catalog, argparse.Namespace], int]
COMMANDS: dict[str, Command] = {
    "model": catalog_cmds.cmd_model,
    "adapter": catalog_cmds.cmd_adapter,
    "variant": catalog_cmds.cmd_variant,
    "list": catalog_cmds.cmd_list,
    "show": catalog_cmds.cmd_show,
    "remove": catalog_cmds.cmd_remove,
    "generate": run_cmds.cmd_generate,
    "compare": run_cmds.cmd_compare,
    "parity": run_cmds.cmd_parity,
    "status": health_cmds.cmd_status,
    "doctor": health_cmds.cmd_doctor,
    "train": train_cmds.cmd_train,
    "train-rl": train_cmds.cmd_train_rl,
    "serve": serve_cmds.cmd_serve,
    "export": export_cmds.cmd_export,
    "key": trust_cmds.cmd_key,
    "trust": trust_cmds.cmd_trust,
    "sign": trust_cmds.cmd_sign,
    "verify": trust_cmds.cmd_verify,
    "policy": trust_cmds.cmd_policy,
    "lineage": lineage_cmds.cmd_lineage,
    "score": score_cmds.cmd_score,
    "eval": score_cmds.cmd_eval,
    "replay": score_cmds.cmd_replay,
    "merge": merge_cmds.cmd_merge,
}
READ_ONLY = frozenset({"list", "show", "status", "doctor", "verify", "lineage"})
FRONTENDS = "variant_studio.frontends"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        command = args.command or "gui"
        if command == "gui":
            return frontend("gui")(getattr(args, "file", None), getattr(args, "check", False))
        try:
            return run(command, args)
        finally:
            # A corrupt state file found on the way was set aside: say so, even when
            # the command itself failed.
            for notice in statefile.take_notices():
                print(f"warning: {notice}", file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return Cancelled.exit_code
    except StudioError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        print(f"error: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def run(command: str, args: argparse.Namespace) -> int:
    catalog = Catalog()
    if command in READ_ONLY:
        with digest.read_only():
            return COMMANDS[command](setup.preview(catalog), args)
    setup.first_run(catalog, with_demo=True)
    catalog_cmds.ensure_openvino_default(catalog, args)
    return COMMANDS[command](catalog, args)


def frontend(name: str) -> Callable[..., int]:
    """A front end registered under the `variant_studio.frontends` entry points."""
    found = [e for e in metadata.entry_points(group=FRONTENDS) if e.name == name]
    if not found:
        raise UsageError(f"the {name} front end is not installed (run ./run.sh)")
    return found[0].load()
