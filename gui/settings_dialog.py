"""Settings: data directory, engine threads, context size, default backend, theme."""

from __future__ import annotations

from PySide6.QtCore import QSettings
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

from engine import paths, settings
from engine.errors import StudioError

THEMES = ("system", "light", "dark")


def user_settings() -> QSettings:
    """Where the data directory's location itself is remembered (outside it)."""
    return QSettings("VariantStudio", "Variant Studio")


class SettingsDialog(QDialog):
    def __init__(self, theme: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        current = settings.load()
        self.data_dir = QLineEdit(str(paths.data_dir()))
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.data_dir, 1)
        row.addWidget(browse)
        self.threads = QSpinBox()
        self.threads.setRange(0, 256)
        self.threads.setSpecialValueText("automatic (one per core)")
        self.threads.setValue(current.threads)
        self.context = QSpinBox()
        self.context.setRange(256, 131072)
        self.context.setSingleStep(256)
        self.context.setValue(current.context_size)
        self.backend = QComboBox()
        self.backend.addItems(["llama", "openvino"])
        self.backend.setCurrentText(current.default_backend)
        self.theme = QComboBox()
        self.theme.addItems(THEMES)
        self.theme.setCurrentText(theme)
        self.note = QLabel("A new data directory takes effect at the next start; "
                           "thread changes restart the engine.")
        self.note.setWordWrap(True)
        self.error = QLabel()
        self.error.setStyleSheet("color:#d23c3c")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok |
                                   QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Data directory", row)
        form.addRow("Engine threads", self.threads)
        form.addRow("Context size (base models)", self.context)
        form.addRow("Default backend for new models", self.backend)
        form.addRow("Theme", self.theme)
        form.addRow(self.note)
        form.addRow(self.error)
        form.addRow(buttons)
        self.threads_changed = False

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Data directory", self.data_dir.text())
        if path:
            self.data_dir.setText(path)

    def save(self) -> None:
        before = settings.load()
        try:
            settings.update(threads=self.threads.value(), context_size=self.context.value(),
                            default_backend=self.backend.currentText())
        except StudioError as exc:
            self.error.setText(exc.message)
            return
        self.threads_changed = before.threads != self.threads.value()
        if self.data_dir.text().strip() != str(paths.data_dir()):
            user_settings().setValue("data_dir", self.data_dir.text().strip())
        self.accept()
