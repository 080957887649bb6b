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
from PySide6.QtGui import QColor, QFont, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
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
    for record in data["adapters"].values():
        meta = record["metadata"]
        badges = [BACKEND_LABELS.get(record["backend"], record["backend"]),
                  "curated" if record["curated"] else "user"]
        if not record.get("verified"):
            badges.append("unverified")
        out["adapters"].append(Entry(
            record["name"], "adapter",
            f"rank {meta.get('rank')} · {', '.join(meta.get('targets') or [])} · "
            f"for {record['base']}", badged(record["name"], badges),
            "; ".join(problems.get(record["name"], [])) or None))
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


class _Filter(QSortFilterProxyModel):
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
}


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
        rect = option.rect.adjusted(6, 3, -6, -3)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        palette = option.palette
        text_color = palette.color(QPalette.ColorRole.HighlightedText if selected
                                   else QPalette.ColorRole.Text)
        fm = option.fontMetrics
        line = fm.height()
        problem = index.data(ProblemRole)
        name = index.data(Qt.ItemDataRole.DisplayRole)
        small = QFont(option.font)
        small.setPointSizeF(max(6.5, option.font.pointSizeF() * 0.8))
        painter.setFont(small)
        sfm = painter.fontMetrics()
        x = rect.right()
        for badge in reversed(index.data(BadgesRole) or ()):
            width = sfm.horizontalAdvance(badge) + 10
            x -= width
            box = QRect(x, rect.top() + 1, width, sfm.height() + 2)
            # On a selected row a white outline keeps a badge that shares the
            # selection's colour (llama.cpp blue) visible.
            painter.setPen(QColor("white") if selected else Qt.PenStyle.NoPen)
            painter.setBrush(QColor(BADGE_COLORS.get(badge, "#777")))
            painter.drawRoundedRect(box, 6, 6)
            painter.setPen(QColor("white"))
            painter.drawText(box, Qt.AlignmentFlag.AlignCenter, badge)
            x -= 4
        font = QFont(option.font)
        font.setBold(True)
        painter.setFont(font)
        bold = painter.fontMetrics()
        painter.setPen(QColor("#d23c3c") if problem and not selected else text_color)
        prefix = "⚠ " if problem else ""
        painter.drawText(QRect(rect.left(), rect.top(), x - rect.left(), line),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         bold.elidedText(prefix + name, Qt.TextElideMode.ElideRight,
                                         max(20, x - rect.left() - 4)))
        painter.setFont(option.font)
        sub = QColor(text_color)
        sub.setAlpha(170)
        painter.setPen(sub)
        painter.drawText(QRect(rect.left(), rect.top() + line + 2, rect.width(), line),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         fm.elidedText(problem or index.data(Qt.ItemDataRole.UserRole) or "",
                                       Qt.TextElideMode.ElideRight, rect.width()))
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
        layout.addWidget(self.tree)

    def load(self, entries: dict[str, list[Entry]]) -> None:
        current = self.current()
        self.model.load(entries)
        self.tree.expandAll()
        if current:
            self.select(current[1])

    def _filter(self, text: str) -> None:
        self.proxy.setFilterFixedString(text.strip())
        self.tree.expandAll()

    def _current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        source = self.proxy.mapToSource(current)
        entry = self.model.entry(source)
        if entry is not None:
            self.selected.emit(entry.kind, entry.name)

    def current(self) -> tuple[str, str] | None:
        entry = self.model.entry(self.proxy.mapToSource(self.tree.currentIndex()))
        return (entry.kind, entry.name) if entry else None

    def select(self, name: str) -> bool:
        index = self.proxy.mapFromSource(self.model.index_of(name))
        if not index.isValid():
            return False
        self.tree.setCurrentIndex(index)
        self.tree.scrollTo(index)
        return True
