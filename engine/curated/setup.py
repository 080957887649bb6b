"""First-run set-up: the catalog a new data directory starts with.

A front end calls `first_run` where it first needs state it will write (the app at
start, a CLI command that changes something or runs a model): the catalog is created
with the embedded base as a curated entry, then the shipped demo adapter and variant.
Read-only commands (`list`, `show`, `doctor`, `status`) call `preview` instead: before
the first run it shows the embedded base as set-up would record it, computed in memory,
and writes nothing (no catalog, no digest cache, no data directory).
"""

from __future__ import annotations

from engine.catalog import digest, imports
from engine.catalog.store import Catalog, empty
from engine.curated import demo, embedded, openvino_default
from engine.state.statefile import MemoryState, write_json_atomic


def first_run(catalog: Catalog, with_demo: bool = False) -> bool:
    """Create the catalog if there is none; True if it was created now.

    A catalog that does not parse is set aside (with a notice) and created afresh; its
    bytes are kept beside it.
    """
    if catalog.exists():
        catalog.data()  # sets a corrupt file aside, raises for an unknown layout
        if catalog.exists():
            demo.adopt_signature(catalog)  # a demo seeded before signatures existed
            demo.adopt_tool_format(catalog)  # ... or before profiles declared formats
            return False
    record = _embedded_record()
    created = False
    with catalog.state.locked():
        if not catalog.exists():
            data = empty()
            if record:
                data["models"][record["name"]] = record
            write_json_atomic(catalog.state.path, data)
            created = True
    if created and record and with_demo:
        # Optional: a missing or broken demo leaves a notice, never a broken catalog.
        demo.seed_catalog(catalog)
    return created


def preview(catalog: Catalog) -> Catalog:
    """`catalog`, or (before the first run) the catalog set-up would create, in memory.

    The preview holds the embedded base only: the demo is copied into the store by
    the first run itself."""
    if catalog.exists():
        catalog.data()
        if catalog.exists():
            return catalog
    with digest.read_only():
        record = _embedded_record()
    data = empty()
    if record:
        data["models"][record["name"]] = record
    # The demo is named as what the first run will add, so a near miss is suggested
    # (and the demo's own name explained) as it is once the catalog exists.
    later = (demo.ADAPTER_NAME, demo.VARIANT_NAME) if record and demo.shipped() else ()
    return Catalog(MemoryState(catalog.state.path, data), later=later)


def _embedded_record() -> dict | None:
    model = embedded.embedded_model_path()
    if model is None:
        return None
    return imports.model_record(embedded.DEFAULT_MODEL_NAME, model, "llama",
                                embedded.DEFAULT_MODEL_SOURCE, True)


def pending_entries(catalog: Catalog) -> list[dict]:
    """Curated models that are available but not built yet, as `list` entries (the
    OpenVINO default before its first use): front ends pass these to
    `engine.catalog.entries`."""
    entry = openvino_default.pending_entry(catalog)
    return [entry] if entry is not None else []
