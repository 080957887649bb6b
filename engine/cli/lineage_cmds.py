"""`variant-studio lineage NAME`: what a model, adapter or variant was made from."""

from __future__ import annotations

import argparse

from engine.catalog import lineage
from engine.catalog.store import Catalog
from engine.cli.output import emit_json


def cmd_lineage(catalog: Catalog, args: argparse.Namespace) -> int:
    tree = lineage.lineage(catalog, args.name)
    if args.json:
        emit_json(tree.to_dict())
        return 0
    for line in lineage.render(tree):
        print(line)
    return 0
