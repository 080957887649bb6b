"""Light and dark palettes (Fusion style), or the platform's own."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

_DEFAULT_PALETTE: list[QPalette] = []


def apply(app: QApplication, theme: str) -> None:
    if not _DEFAULT_PALETTE:
        _DEFAULT_PALETTE.append(app.palette())
    app.setStyle(QStyleFactory.create("Fusion"))
    if theme == "dark":
        app.setPalette(dark_palette())
    elif theme == "light":
        app.setPalette(app.style().standardPalette())
    else:
        app.setPalette(_DEFAULT_PALETTE[0])


def dark_palette() -> QPalette:
    p = QPalette()
    role = QPalette.ColorRole
    colors = {
        role.Window: "#232629", role.WindowText: "#e6e6e6", role.Base: "#1b1d1f",
        role.AlternateBase: "#2a2d31", role.ToolTipBase: "#2a2d31",
        role.ToolTipText: "#e6e6e6", role.Text: "#e6e6e6", role.Button: "#2f3236",
        role.ButtonText: "#e6e6e6", role.BrightText: "#ff6b6b", role.Highlight: "#2f6fdf",
        role.HighlightedText: "#ffffff", role.Link: "#7aa7ff", role.PlaceholderText: "#8a8f98",
    }
    for r, c in colors.items():
        p.setColor(r, QColor(c))
    for r in (role.Text, role.ButtonText, role.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, r, QColor("#6b6f75"))
    return p
