"""The library sidebar: base models, adapters and variants as a Qt item model.

`LibraryModel` is a read-only tree over a snapshot of the catalog (three sections,
one row per entry) with badges for backend, curated or user-provided, and problems
(a base whose file changed, an adapter that no longer validates). The view filters it
through a proxy for search; widgets never hold catalog data themselves. Entries whose
check would read whole files are shown "unchecked" until the window's background
check has read them (see gui.controllers.library_check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QModelIndex,
    QPersistentModelIndex,
    QRect,
    QSize,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLabel,
    QLineEdit,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import health, resolve
from engine.catalog.store import Catalog
from engine.catalog.trust import display
from engine.catalog.trust.policy import policy as signature_policy
from engine.curated import setup
from engine.errors import StudioError

SECTIONS = (("models", "Base models"), ("adapters", "Adapters"), ("variants", "Variants"))
NameRole = Qt.ItemDataRole.UserRole + 1
KindRole = Qt.ItemDataRole.UserRole + 2
BadgesRole = Qt.ItemDataRole.UserRole + 3
ProblemRole = Qt.ItemDataRole.UserRole + 4
BACKEND_LABELS = {"llama": "llama.cpp", "openvino": "OpenVINO"}


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # "model" | "adapter" | "variant"
    subtitle: str
    badges: tuple[str, ...]
    problem: str | None


def snapshot(catalog: Catalog, problems: dict[str, list[str]] | None = None,
             checking: set[str] | frozenset[str] = frozenset()) -> dict[str, list[Entry]]:
    """Read the catalog into display entries, with problems checked.

    `problems` are ones already found (by a background check); without them the
    entries not in `checking` are checked here, which is cheap for them (the caches
    answer). Entries in `checking` get an "unchecked" badge and no problem yet.
    """
    data = catalog.data()
    if problems is None:
        problems = health.status_of_records(catalog, skip=checking)

    def badged(name: str, badges: list[str]) -> tuple[str, ...]:
        return (*badges, "unchecked") if name in checking else tuple(badges)
    out: dict[str, list[Entry]] = {key: [] for key, _ in SECTIONS}
    for record in data["models"].values():
        out["models"].append(Entry(
            record["name"], "model", f"{record['metadata'].get('architecture', '?')} · "
            f"{record['metadata'].get('file_type', '')}",
            badged(record["name"], [BACKEND_LABELS.get(record["backend"], record["backend"]),
                                    "curated" if record["curated"] else "user"]),
            "; ".join(problems.get(record["name"], [])) or None))
    for pending in setup.pending_entries(catalog):
        # Listed before its first use, like `variant-studio list` (the OpenVINO default).
        out["models"].append(Entry(pending["name"], "model", pending["summary"],
                                   (BACKEND_LABELS["openvino"], "curated", "not built"), None))
    policy = signature_policy(catalog)
    for record in data["adapters"].values():
        meta = record["metadata"]
        badges = [BACKEND_LABELS.get(record["backend"], record["backend"]),
                  "curated" if record["curated"] else "user"]
        if not record.get("verified"):
            badges.append("unverified")
        badge, signature_problem = _signature_badge(catalog, record, policy,
                                                    record["name"] in checking)
        if badge:
            badges.append(badge)
        served = record.get("served_check")
        served_problem = []
        if isinstance(served, dict) and served.get("passed") is False:
            badges.append("served check failed")
            served_problem.append(f"served check failed: {served.get('reason')}")
        out["adapters"].append(Entry(
            record["name"], "adapter",
            f"rank {meta.get('rank')} · {', '.join(meta.get('targets') or [])} · "
            f"for {record['base']}", badged(record["name"], badges),
            "; ".join([*problems.get(record["name"], []), *signature_problem,
                       *served_problem]) or None))
    for record in data["variants"].values():
        parts = " + ".join(f"{a['name']}@{a['scale']:g}" for a in record["adapters"])
        problem = None
        dependency_problems = [p for dep in [record["base"], *(a["name"] for a in
                                                              record["adapters"])]
                               for p in problems.get(dep, [])]
        if dependency_problems:
            problem = "a part of this variant has a problem: " + dependency_problems[0]
        try:
            resolve.identity(catalog, record["name"])
        except StudioError as exc:
            problem = exc.message
        out["variants"].append(Entry(
            record["name"], "variant", f"{record['base']} + {parts}",
            badged(record["name"], [BACKEND_LABELS.get(record["backend"], record["backend"]),
                                    "curated" if record["curated"] else "user"]), problem))
    for entries in out.values():
        entries.sort(key=lambda e: e.name.lower())
    return out


# Above this size a signature not yet verified is left to the detail pane (showing an
# entry must not hash gigabytes on the GUI thread); verdicts are cached once known.
SIGNATURE_INLINE_BYTES = 64 << 20


def _signature_badge(catalog: Catalog, record: dict[str, Any], policy: str,
                     unchecked: bool) -> tuple[str | None, list[str]]:
    """The signature badge of an adapter (`signed · KEY`, `signature invalid`, or
    `unsigned` when the policy asks for signatures) and its problem when required."""
    try:
        verdict = display.status(
            catalog, record["name"],
            cached_only=unchecked or int(record.get("size") or 0) > SIGNATURE_INLINE_BYTES)
    except StudioError as exc:
        return "signature invalid", [exc.message]
    if verdict is None:
        return "signature unchecked", []
    required = bool(record.get("curated")) or policy == "require"
    if verdict.ok:
        return verdict.label(), []
    if verdict.status == "unsigned":
        return ("unsigned", ["unsigned (policy require)"] if required else []) \
            if policy != "off" or required else (None, [])
    return "signature invalid", [f"signature invalid: {verdict.reason}"] if required else []


class LibraryModel(QAbstractItemModel):
    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._data: dict[str, list[Entry]] = {key: [] for key, _ in SECTIONS}

    def load(self, entries: dict[str, list[Entry]]) -> None:
        self.beginResetModel()
        self._data = entries
        self.endResetModel()

    def entry(self, index: QModelIndex) -> Entry | None:
        if not index.isValid() or index.internalId() == 0:
            return None
        section = SECTIONS[index.internalId() - 1][0]
        rows = self._data[section]
        return rows[index.row()] if index.row() < len(rows) else None

    def index_of(self, name: str) -> QModelIndex:
        for s, (key, _) in enumerate(SECTIONS):
            for row, entry in enumerate(self._data[key]):
                if entry.name == name:
                    return self.index(row, 0, self.index(s, 0))
        return QModelIndex()

    def names(self, kind: str) -> list[str]:
        return [e.name for e in self._data[kind + "s"]]

    # -- QAbstractItemModel

    def index(self, row: int, column: int, parent: QModelIndex | QPersistentModelIndex
              = QModelIndex()) -> QModelIndex:  # noqa: B008
        if column != 0 or row < 0:
            return QModelIndex()
        if not parent.isValid():
            return self.createIndex(row, 0, 0) if row < len(SECTIONS) else QModelIndex()
        if parent.internalId() == 0:
            section = SECTIONS[parent.row()][0]
            if row < len(self._data[section]):
                return self.createIndex(row, 0, parent.row() + 1)
        return QModelIndex()

    def parent(self, index: QModelIndex | QPersistentModelIndex = QModelIndex()  # noqa: B008
               ) -> QModelIndex:
        if not index.isValid() or index.internalId() == 0:
            return QModelIndex()
        return self.createIndex(index.internalId() - 1, 0, 0)

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()  # noqa: B008
                 ) -> int:
        if not parent.isValid():
            return len(SECTIONS)
        if parent.internalId() == 0:
            return len(self._data[SECTIONS[parent.row()][0]])
        return 0

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()  # noqa: B008
                    ) -> int:
        return 1

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        if index.internalId() == 0:
            return Qt.ItemFlag.ItemIsEnabled
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def data(self, index: QModelIndex | QPersistentModelIndex,
             role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        if index.internalId() == 0:
            key, title = SECTIONS[index.row()]
            if role == Qt.ItemDataRole.DisplayRole:
                return f"{title}  ({len(self._data[key])})"
            if role == Qt.ItemDataRole.FontRole:
                font = QFont()
                font.setBold(True)
                return font
            return None
        entry = self.entry(QModelIndex(index))
        if entry is None:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return entry.name
        if role == Qt.ItemDataRole.ToolTipRole:
            # The full name too: next to its badges a long name is elided in the row.
            return f"{entry.name}\n{entry.problem or entry.subtitle}"
        if role == NameRole:
            return entry.name
        if role == KindRole:
            return entry.kind
        if role == BadgesRole:
            return entry.badges
        if role == ProblemRole:
            return entry.problem
        if role == Qt.ItemDataRole.UserRole:
            return entry.subtitle
        return None


def display_name(metrics: QFontMetrics, name: str, width: int) -> str:
    """A name as the row shows it: elided in the middle, so the end that tells two long
    names apart ("…-instruct" and "…-instruct-openvino") stays; the tooltip has it whole."""
    return metrics.elidedText(name, Qt.TextElideMode.ElideMiddle, max(20, width))


class _Filter(QSortFilterProxyModel):
    def data(self, index: QModelIndex | QPersistentModelIndex,
             role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        # A section's count is what the search leaves of it ("1 of 3").
        if role == Qt.ItemDataRole.DisplayRole and not index.parent().isValid() and \
                self.filterRegularExpression().pattern():
            source = self.mapToSource(index)
            total = self.sourceModel().rowCount(source)
            title = SECTIONS[source.row()][1]
            return f"{title}  ({self.rowCount(index)} of {total})"
        return super().data(index, role)

    def filterAcceptsRow(self, row: int, parent: QModelIndex | QPersistentModelIndex) -> bool:
        if not parent.isValid():
            return True  # sections always show
        text = self.filterRegularExpression().pattern().lower()
        if not text:
            return True
        index = self.sourceModel().index(row, 0, parent)
        haystack = " ".join(str(self.sourceModel().data(index, role) or "") for role in
                            (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.UserRole))
        return text in haystack.lower()


BADGE_COLORS = {
    "llama.cpp": "#2f6fdf", "OpenVINO": "#0a8f6a", "curated": "#7a5bd0", "user": "#8a8f98",
    "unverified": "#c07a00", "unchecked": "#5f6b7a",
    "unsigned": "#8a8f98", "signature invalid": "#d23c3c", "signature unchecked": "#5f6b7a",
}
SIGNED_COLOR = "#1f9d55"  # `signed · KEY` badges


ROW_MARGIN = 6  # an entry's row, left and right, inside its rect


def name_font(font: QFont) -> QFont:
    """The font an entry's name is drawn in: the row's, bold."""
    bold = QFont(font)
    bold.setBold(True)
    return bold


def name_room(row_width: int) -> int:
    """The pixels an entry's name has in a row `row_width` wide (the margins, and 4 px
    that keep it off the edge)."""
    return row_width - 2 * ROW_MARGIN - 4


class BadgeDelegate(QStyledItemDelegate):
    """Draws the name, a subtitle and small coloured badges; problems in red."""

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        size = super().sizeHint(option, index)
        if index.parent().isValid():
            return QSize(size.width(), int(option.fontMetrics.height() * 2.6))
        return QSize(size.width(), int(option.fontMetrics.height() * 1.8))

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex
              ) -> None:
        if not index.parent().isValid():
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        style = opt.widget.style() if opt.widget else None
        opt.text = ""
        if style:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        painter.save()
        rect = option.rect.adjusted(ROW_MARGIN, 3, -ROW_MARGIN, -3)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        palette = option.palette
        text_color = palette.color(QPalette.ColorRole.HighlightedText if selected
                                   else QPalette.ColorRole.Text)
        fm = option.fontMetrics
        line = fm.height()
        problem = index.data(ProblemRole)
        name = index.data(Qt.ItemDataRole.DisplayRole)
        # Line 1: the name, with the row's whole width (a sidebar is narrow, and
        # badges beside the name left it "…"). Line 2: the badges, then the subtitle.
        painter.setFont(name_font(option.font))
        bold = painter.fontMetrics()
        painter.setPen(QColor("#d23c3c") if problem and not selected else text_color)
        prefix = "⚠ " if problem else ""
        painter.drawText(QRect(rect.left(), rect.top(), rect.width(), line),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         prefix + display_name(bold, name, name_room(option.rect.width()) -
                                               bold.horizontalAdvance(prefix)))
        small = QFont(option.font)
        small.setPointSizeF(max(6.5, option.font.pointSizeF() * 0.8))
        painter.setFont(small)
        sfm = painter.fontMetrics()
        x = rect.left()
        top = rect.top() + line + 2
        for badge in index.data(BadgesRole) or ():
            width = sfm.horizontalAdvance(badge) + 10
            if x + width > rect.right():
                break  # the tooltip lists the entry whole
            box = QRect(x, top + 1, width, sfm.height() + 2)
            # On a selected row a white outline keeps a badge that shares the
            # selection's colour (llama.cpp blue) visible.
            painter.setPen(QColor("white") if selected else Qt.PenStyle.NoPen)
            painter.setBrush(QColor(BADGE_COLORS.get(
                badge, SIGNED_COLOR if badge.startswith("signed ·") else "#777")))
            painter.drawRoundedRect(box, 6, 6)
            painter.setPen(QColor("white"))
            painter.drawText(box, Qt.AlignmentFlag.AlignCenter, badge)
            x += width + 4
        painter.setFont(option.font)
        sub = QColor(text_color)
        sub.setAlpha(170)
        painter.setPen(sub)
        painter.drawText(QRect(x, top, rect.right() - x, line),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         fm.elidedText(problem or index.data(Qt.ItemDataRole.UserRole) or "",
                                       Qt.TextElideMode.ElideRight, max(0, rect.right() - x)))
        painter.restore()


class LibraryView(QWidget):
    """Search box + tree; emits the selected entry's (kind, name)."""

    selected = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = LibraryModel(self)
        self.proxy = _Filter(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setRecursiveFilteringEnabled(True)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search models, adapters, variants…  (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._filter)
        self.search.setAccessibleName("Search the library")
        self.no_matches = QLabel("no matches")
        self.no_matches.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.no_matches.setStyleSheet("color:#888;padding:6px")
        self.no_matches.hide()
        # What the panes show: kept while a search hides it (the search filters the
        # list; it does not choose another entry, nor another comparison target).
        self._chosen: tuple[str, str] | None = None
        self._filtering = False
        self.tree = QTreeView()
        self.tree.setModel(self.proxy)
        self.tree.setHeaderHidden(True)
        self.tree.setItemDelegate(BadgeDelegate(self.tree))
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setUniformRowHeights(False)
        self.tree.setAnimated(True)
        self.tree.selectionModel().currentChanged.connect(self._current)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.search)
        layout.addWidget(self.no_matches)
        layout.addWidget(self.tree)
        self.tree.setAccessibleName("Library")
        # Never squeezed below about 30 characters: a page asking for more width used
        # to take it from the library until its names read "s…t".
        self.setMinimumWidth(self.fontMetrics().averageCharWidth() * 30)

    def load(self, entries: dict[str, list[Entry]]) -> None:
        current = self.current()
        self._filtering = True  # the reset moves the tree's current row: not a choice
        self.model.load(entries)
        self.tree.expandAll()
        self._filtering = False
        if current and not self.select(current[1]):
            found = self.model.entry(self.model.index_of(current[1]))
            # Still there but hidden by the search: still the entry on show.
            self._chosen = (found.kind, found.name) if found else None
        self._show_matches()

    def _filter(self, text: str) -> None:
        self._filtering = True
        try:
            self.proxy.setFilterFixedString(text.strip())
            self.tree.expandAll()
            shown = self._chosen and self.proxy.mapFromSource(
                self.model.index_of(self._chosen[1]))
            if shown is not None and shown and shown.isValid():
                self.tree.setCurrentIndex(shown)
            else:
                self.tree.selectionModel().clearSelection()
        finally:
            self._filtering = False
        self._show_matches()

    def _show_matches(self) -> None:
        searching = bool(self.search.text().strip())
        visible = sum(self.proxy.rowCount(self.proxy.index(s, 0))
                      for s in range(self.proxy.rowCount()))
        self.no_matches.setVisible(searching and visible == 0)

    def _current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if self._filtering:
            return
        source = self.proxy.mapToSource(current)
        entry = self.model.entry(source)
        if entry is not None:
            self._chosen = (entry.kind, entry.name)
            self.selected.emit(entry.kind, entry.name)

    def current(self) -> tuple[str, str] | None:
        if self._chosen and self.model.index_of(self._chosen[1]).isValid():
            return self._chosen
        entry = self.model.entry(self.proxy.mapToSource(self.tree.currentIndex()))
        return (entry.kind, entry.name) if entry else None

    def select(self, name: str) -> bool:
        index = self.proxy.mapFromSource(self.model.index_of(name))
        if not index.isValid():
            return False
        if self.tree.currentIndex() == index and self._chosen and self._chosen[1] != name:
            self.tree.setCurrentIndex(QModelIndex())  # so the change is announced
        self.tree.setCurrentIndex(index)
        self.tree.scrollTo(index)
        return True
