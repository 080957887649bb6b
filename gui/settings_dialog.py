"""Settings: data directory, engine threads, context size, default backend, theme."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from engine.errors import StudioError
from engine.formats.safeio import printable
from engine.state import paths, settings
from gui.widgets.elided_label import ElidedLabel

THEMES = ("system", "light", "dark")


def user_settings() -> QSettings:
    """Where the data directory's location itself is remembered (outside it)."""
    return QSettings("VariantStudio", "Variant Studio")


def data_dir_problem(text: str) -> str | None:
    """Why `text` cannot be the data directory (None when it can).

    The app creates the directory at its next start and keeps all its state there,
    so it must be an absolute path that is, or can become, a writable directory.
    """
    if not text:
        return "choose a data directory"
    if "\0" in text:
        return "the data directory path contains a NUL character"
    path = Path(text).expanduser()
    shown = printable(str(path), 300)
    if not path.is_absolute():
        return f"the data directory must be an absolute path, not {shown}"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    blocker = "" if existing == path else \
        f" cannot be created: {printable(str(existing), 300)}"
    if not existing.is_dir():
        return f"{shown}{blocker} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{shown}{blocker} is not writable"
    return None


class SettingsDialog(QDialog):
    def __init__(self, theme: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        current = settings.load()
        self.setMinimumWidth(560)
        home = str(paths.data_dir())
        # The directory in use, whole in its tooltip; elided in the middle, so both its
        # start and its distinguishing end stay readable.
        self.data_dir_now = ElidedLabel(home, Qt.TextElideMode.ElideMiddle)
        self.data_dir_now.setToolTip(home)
        self.data_dir_now.setAccessibleName("Data directory in use")
        self.data_dir_now.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        change = QPushButton("Change…")
        change.clicked.connect(self._change)
        now_row = QHBoxLayout()
        now_row.addWidget(self.data_dir_now, 1)
        now_row.addWidget(change)
        self.data_dir = QLineEdit(home)
        self.data_dir.setAccessibleName("New data directory")
        self.data_dir.setToolTip("An absolute path; it takes effect at the next start")
        self.browse = QPushButton("Choose…")
        self.browse.clicked.connect(self._browse)
        self.new_dir = QWidget()
        row = QHBoxLayout(self.new_dir)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.data_dir, 1)
        row.addWidget(self.browse)
        self.new_dir.hide()
        self.threads = QSpinBox()
        self.threads.setRange(0, 256)
        self.threads.setSpecialValueText("automatic (one per free core)")
        self.threads.setValue(current.threads)
        self.context = QSpinBox()
        self.context.setRange(256, 131072)
        self.context.setSingleStep(256)
        self.context.setValue(current.context_size)
        self.backend = QComboBox()
        # Shown as everywhere else in the app; the setting keeps the backend's id.
        self.backend.addItem("llama.cpp", "llama")
        self.backend.addItem("OpenVINO", "openvino")
        self.backend.setCurrentIndex(max(0, self.backend.findData(current.default_backend)))
        self.theme = QComboBox()
        self.theme.addItems(THEMES)
        self.theme.setCurrentText(theme)
        self.note = QLabel("A new data directory takes effect at the next start; "
                           "thread changes restart the engine.")
        self.note.setWordWrap(True)
        self.error = QLabel()
        self.error.setStyleSheet("color:#d23c3c")
        self.error.setWordWrap(True)
        self.error.setTextFormat(Qt.TextFormat.PlainText)  # messages quote user paths
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok |
                                   QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Data directory", now_row)
        self.new_dir_label = QLabel("New location")
        form.addRow(self.new_dir_label, self.new_dir)
        self.new_dir_label.hide()
        form.addRow("Engine threads", self.threads)
        form.addRow("Context size (base models)", self.context)
        form.addRow("Default backend for new models", self.backend)
        form.addRow("Theme", self.theme)
        form.addRow(self.note)
        form.addRow(self.error)
        form.addRow(buttons)
        self.threads_changed = False

    def _change(self) -> None:
        self.new_dir_label.show()
        self.new_dir.show()
        self.data_dir.setFocus()
        self.data_dir.selectAll()

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Data directory", self.data_dir.text())
        if path:
            self.data_dir.setText(path)

    def save(self) -> None:
        # Check everything before changing anything: a refused dialog saves nothing.
        data_dir = self.data_dir.text().strip()
        moved = data_dir != str(paths.data_dir())
        problem = data_dir_problem(data_dir) if moved else None
        if problem:
            self.error.setText(problem)
            return
        before = settings.load()
        try:
            settings.update(threads=self.threads.value(), context_size=self.context.value(),
                            default_backend=self.backend.currentData())
        except StudioError as exc:
            self.error.setText(exc.message)
            return
        self.threads_changed = before.threads != self.threads.value()
        if moved:
            user_settings().setValue("data_dir", str(Path(data_dir).expanduser()))
        self.accept()
