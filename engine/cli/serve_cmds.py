"""The serve command: the local OpenAI-compatible server, in the foreground."""

from __future__ import annotations

import argparse
import sys
import time

from engine.catalog.store import Catalog
from engine.serve.app import LogEntry
from engine.serve.config import ServeConfig
from engine.serve.server import serve


def log_line(entry: LogEntry) -> None:
    """One stderr line per request: time, status, model, identity, tokens, speed, and
    why it failed (a refused request is logged too)."""
    print(f"{time.strftime('%H:%M:%S', time.localtime(entry.time))} {entry.status} "
          f"{entry.path} {entry.model} [{entry.identity or '-'}] {entry.prompt_tokens}+"
          f"{entry.completion_tokens} tokens {entry.tokens_per_second:.1f} tok/s "
          f"{entry.seconds:.2f} s" + (f": {entry.reason}" if entry.reason else ""),
          file=sys.stderr, flush=True)


def cmd_serve(catalog: Catalog, args: argparse.Namespace) -> int:
    names = tuple(n.strip() for n in args.variants.split(",") if n.strip()) \
        if args.variants else None
    for name in names or ():
        catalog.find(name)  # an unknown name is refused before anything starts
    config = ServeConfig(host=args.host, port=args.port, api_key=args.api_key,
                         variants=names, max_sessions=args.max_sessions,
                         cors_origin=args.cors_origin)
    return serve(config, catalog, log_line)
