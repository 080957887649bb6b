"""One signal for "the catalog changed", so each view refreshes only what it shows.

The main window owns one `CatalogEvents` and hands it to every view, dialog and
controller. Whatever changes the catalog (the import wizard, adding a base model,
composing, editing or removing an entry, converting an adapter, building the OpenVINO
default, a training run) or the default model calls `changed(kinds, names)` once it is
done; each view listens for the kinds it cares about:

| kind      | changed by                                   | who refreshes            |
| --------- | -------------------------------------------- | ------------------------ |
| "model"   | add model, remove, OpenVINO build            | library, chat, compare, train |
| "adapter" | import, remove, convert, OpenVINO build, training | library, chat, compare, train |
| "variant" | import, compose, edit, remove, training      | library, chat, compare   |
| "default" | Use as default (settings.default_model)      | the detail pane          |
| "evaluation" | a score kept on an adapter's evaluation set (Evaluate) | the detail pane |

(An adapter or model change can change which backends serve a variant, so the chat's
and the comparison's backend pickers listen for those too.) `names` are the entries
that changed; a view may use them to skip a refresh that cannot concern it.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QObject, Signal

KINDS = ("model", "adapter", "variant", "default", "evaluation")
CATALOG_KINDS = frozenset({"model", "adapter", "variant"})  # what catalog.json holds


class CatalogEvents(QObject):
    # kinds (a sorted list of KINDS), names of the entries that changed
    catalogChanged = Signal(list, list)

    def changed(self, kinds: Iterable[str], names: Iterable[str] = ()) -> None:
        """Announce a change (call it on the GUI thread, after the change is written)."""
        kinds = sorted(set(kinds))
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown catalog change kinds: {sorted(unknown)}")
        self.catalogChanged.emit(kinds, [n for n in dict.fromkeys(names) if n])


def touches(kinds: Iterable[str], wanted: Iterable[str]) -> bool:
    """Does a change of `kinds` concern a view that shows `wanted`?"""
    return not set(kinds).isdisjoint(wanted)
