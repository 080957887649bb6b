"""The detail pane: provenance, compatibility checks, identity and parts of an entry.

Everything shown comes from `engine.catalog.entries.show_entry` (the same data `show --json`
prints), escaped for display: artifact metadata is untrusted text.
"""

from __future__ import annotations

import html
import re
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTableView,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.catalog.entries import provenance_lines
from engine.catalog.evaluation import score_line
from engine.formats.safeio import printable

STATUS_ICONS = {"pass": ("✓", "#1f9d55"), "warn": ("!", "#c07a00"), "fail": ("✗", "#d23c3c")}


class ChecksModel(QAbstractTableModel):
    """Rows of {name, status, detail}."""

    HEADERS = ("", "Check", "Result")

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.rows: list[dict[str, str]] = []

    def load(self, rows: list[dict[str, str]]) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()  # noqa: B008
                 ) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()  # noqa: B008
                    ) -> int:
        return 3

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.HEADERS[section]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex,
             role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        icon, color = STATUS_ICONS.get(row["status"], ("?", "#777"))
        if index.column() == 0:
            if role == Qt.ItemDataRole.DisplayRole:
                return icon
            if role == Qt.ItemDataRole.ForegroundRole:
                return QColor(color)
            if role == Qt.ItemDataRole.TextAlignmentRole:
                return Qt.AlignmentFlag.AlignCenter
            if role == Qt.ItemDataRole.UserRole:
                return row["status"]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            text = row["name"] if index.column() == 1 else row["detail"]
            return printable(str(text), 2000)
        return None


LABELS = {
    "sha256": "Digest (sha256)", "identity key": "Identity key", "backend": "Runtime",
    "compute": "OpenVINO profile",
    "base_sha256": "Base digest", "adapters": "Adapters",
    "chat_template_sha256": "Chat-template digest", "bos_policy": "Start-of-text token",
    "runtime": "Runtime version", "context": "Context", "system_prompt": "System prompt",
    "n_ctx": "Context size", "top_p": "Top-p", "top_k": "Top-k",
    "repeat_penalty": "Repeat penalty", "max_tokens": "Max tokens",
    "file_type": "Quantization", "block_count": "Layers", "embedding_length": "Embedding size",
    "feed_forward_length": "Feed-forward size", "head_count": "Attention heads",
    "head_count_kv": "Key/value heads", "context_length": "Trained context",
    "vocab_size": "Vocabulary", "bos_token_id": "Start-of-text token id",
    "eos_token_id": "End-of-text token id", "add_bos": "Adds a start-of-text token",
    "add_eos": "Adds an end-of-text token", "tensor_types": "Tensor types",
    "model_name": "Model name", "expected base sha256": "Declared base digest",
    "rank / alpha": "Rank / alpha", "backend / format": "Runtime / format",
}
DIGEST = re.compile(r"^[0-9a-f]{40,64}$")
RUNTIMES = {"llama": "llama.cpp", "openvino": "OpenVINO"}


def human_label(key: str) -> str:
    """A record's key as a person reads it ("Base digest", not `base_sha256`)."""
    if key in LABELS:
        return LABELS[key]
    if "_" not in key:
        return key  # already words ("source", "signature")
    words = key.replace("_", " ")
    return words[:1].upper() + words[1:]


def digest_html(value: str, whole: bool = False) -> str:
    """A long digest shortened (whole in its tooltip), with a Copy link; `whole` keeps
    the entry's own digest readable in full, the one a reviewer compares by eye."""
    shown = value if whole else f"{value[:12]}…{value[-4:]}"
    return (f"<code title='{value}'>{shown}</code> "
            f"<a href='copy:{value}' style='text-decoration:none'>Copy</a>")


def _human_value(key: str, value: Any) -> str:
    if key == "bos_policy" and isinstance(value, str) and "add_bos=" in value:
        parts = dict(p.split("=", 1) for p in value.split(";") if "=" in p)
        added = "added" if parts.get("add_bos") == "true" else "not added"
        return added + (f" (token {parts['bos']})" if parts.get("bos") else "")
    if key == "backend" and value in RUNTIMES:
        return RUNTIMES[value]
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "—"
    return str(value)


def _plain_row(label: str, value: Any) -> str:
    text = html.escape(printable(str(value), 400)) if value is not None else "—"
    return f"<tr><td class='k'>{html.escape(label)}</td><td>{text}</td></tr>"


def _row(label: str, value: Any, mono: bool = False, whole: bool = False) -> str:
    raw = printable(str(value), 400) if value is not None else None
    if raw is not None and DIGEST.match(raw):
        text = digest_html(raw, whole)
    else:
        text = html.escape(raw) if raw is not None else "—"
        if mono:
            text = f"<code>{text}</code>"
    return f"<tr><td class='k'>{html.escape(human_label(label))}</td><td>{text}</td></tr>"


def _identity_value(key: str, value: Any) -> str:
    if key == "adapters":
        return "; ".join(f"{a['name']} @ {a['scale']:g} (sha256 {a['sha256'][:12]}…)"
                         for a in value) or "none (the plain base)"
    if key == "context":
        return ", ".join(f"{human_label(k).lower()} {v}" for k, v in value.items())
    if key == "compute" and isinstance(value, dict):
        return (f"{value.get('name')}: {value.get('weights')} weights at "
                f"{value.get('precision')}, KV cache {value.get('kv_cache')} (sha256 "
                f"{str(value.get('weights_sha256'))[:12]}…)")
    return _human_value(key, value)


def signature_text(signature: dict[str, Any]) -> str:
    """The detail pane's signature row: valid and by whom, unsigned, or invalid and why."""
    policy = f"policy {signature.get('policy')}" + (", required" if signature.get("required")
                                                   else "")
    fingerprint = (signature.get("fingerprint") or "")[:16]
    if signature.get("status") == "valid":
        return (f"valid: signed by {signature.get('signer')} (key {fingerprint}…); "
                f"{', '.join(signature.get('files') or [])} unchanged; {policy}")
    if signature.get("status") == "unsigned":
        return f"unsigned ({policy})"
    return f"invalid: {signature.get('reason')} ({policy})"


def render_html(entry: dict[str, Any]) -> str:
    """HTML for the provenance and identity of one `show` entry."""
    kind = entry["kind"]
    rows: list[str] = []
    if entry.get("built") is False:  # the OpenVINO default before its first use
        rows.append(_row("not built yet", entry.get("how")))
    if kind in ("model", "adapter"):
        rows.append(_row("sha256", entry.get("sha256"), mono=True, whole=True))
        rows.append(_row("source", entry.get("source")))
        rows.append(_row("installed", entry.get("installed_at")))
        rows.append(_row("status", "curated" if entry.get("curated") else "user-provided"))
        rows.append(_row("backend / format", f"{entry.get('backend')} / {entry.get('format')}"))
        rows.append(_row("path", entry.get("path"), mono=True))
        size = entry.get("size")
        if size:
            rows.append(_row("size", f"{size / 2**20:.1f} MiB"))
    if kind == "adapter":
        rows.append(_row("base", entry.get("base")))
        rows.append(_row("expected base sha256", entry.get("expected_base_sha256") or
                         "not declared", mono=True))
        rows.append(_row("verified", "yes: declares and matches its base's digest"
                         if entry.get("verified") else "no: user-provided, unverified"))
        rows.append(_row("rank / alpha", f"{entry.get('rank')} / {entry.get('alpha')}"))
        rows.append(_row("targets", ", ".join(entry.get("targets") or [])))
        signature = entry.get("signature")
        if isinstance(signature, dict):
            rows.append(_row("signature", signature_text(signature)))
    if kind == "variant":
        rows.append(_row("base", entry.get("base")))
        for a in entry.get("adapters", []):
            rows.append(_row(f"adapter {a['name']}", f"scale {a['scale']:g} · sha256 "
                             f"{(a.get('sha256') or '?')[:16]}…"))
        rows.append(_row("status", "curated" if entry.get("curated") else "user-provided"))
    if entry.get("compute"):  # the OpenVINO profile served (docs/formats.md, "Profiles")
        rows.append(_row("compute", entry["compute"]))
    if entry.get("identity"):
        rows.append(_row("identity key", entry["identity"], mono=True))
    parts = [f"<h2>{html.escape(printable(entry['name'], 80))} "
             f"<span class='kind'>{kind}</span></h2>",
             "<table class='props'>" + "".join(rows) + "</table>"]
    detail = entry.get("identity_detail")
    if detail:
        identity_rows = [_row(k, _identity_value(k, v)) for k, v in detail.items()
                         if k != "key"]
        parts.append("<h3>Identity</h3><p style='color:#888;margin:0 0 4px 0'>What "
                     "decides how it computes an answer: the runtime, the base file, each "
                     "adapter file with its scale, the chat template and the context size. "
                     "Two entries with the same identity are the same model; a change to "
                     "any of these makes another one.</p>"
                     "<table class='props'>" + "".join(identity_rows) + "</table>")
    capabilities = entry.get("capabilities")
    if capabilities:  # what this base can be used for, or exactly why not
        body = "".join(_plain_row(("✓ " if c["ok"] else "✗ ") + c["name"], c["reason"])
                       for c in capabilities)
        parts.append(f"<h3>What it can do</h3><table class='props'>{body}</table>")
    for section, title in (("profile", "Profile"), ("metadata", "Format metadata")):
        value = entry.get(section)
        if isinstance(value, dict) and value:
            body = "".join(_row(str(k), _human_value(str(k), v) if not isinstance(v, dict)
                                else ", ".join(f"{a} {b}" for a, b in v.items()))
                           for k, v in value.items() if k != "target_shapes")
            parts.append(f"<h3>{title}</h3><table class='props'>{body}</table>")
    provenance = entry.get("provenance")
    if isinstance(provenance, dict) and provenance:
        # The same readable lines as `show` (digests, seed, settings, versions, the
        # loss summary), not the raw record, whose loss curve would fill every row.
        try:
            lines = provenance_lines(provenance)
        except (KeyError, TypeError, ValueError, AttributeError):  # a malformed record
            lines = [f"{key}: {value}" for key, value in provenance.items()]
        # As `show` prints them (keys and whole digests: what a reviewer compares).
        body = "".join(_plain_row(*line.partition(": ")[::2]) for line in lines)
        parts.append(f"<h3>Training provenance</h3><table class='props'>{body}</table>")
    parts.extend(evaluation_html(entry.get("evaluation")))
    style = ("<style>h2{margin:0 0 6px 0} .kind{font-size:small;color:#888;"
             "font-weight:normal} td.k{color:#888;padding-right:14px;white-space:nowrap}"
             " td{padding:2px 4px;vertical-align:top} code{font-family:monospace}</style>")
    return style + "".join(parts)


def evaluation_html(found: Any) -> list[str]:
    """The evaluation set(s) of an entry (`show`'s `evaluation`: one for an adapter, one
    per adapter for a variant) with the latest scores kept on them."""
    out = []
    for item in [found] if isinstance(found, dict) else found or []:
        rows = [_row("set", f"{item['file']} · {item['rows']} items ({item['kind']}) · "
                            f"attached {item['attached_at']}"),
                _row("sha256", item["sha256"], mono=True)]
        for model, per_backend in item["scores"].items():
            for backend, score in per_backend.items():
                rows.append(_row(f"{model} ({backend})",
                                 score_line(model, backend, score).split(": ", 1)[1]))
        if not item["scores"]:
            rows.append(_row("scores", "none yet: run it in Evaluate (Ctrl+E)"))
        out.append(f"<h3>Evaluation set of {html.escape(item['adapter'])}</h3>"
                   f"<table class='props'>{''.join(rows)}</table>")
    return out


class DetailPane(QWidget):
    """Shows one entry; its buttons ask the window to act on it."""

    chatRequested = Signal(str)
    compareRequested = Signal(str)
    editRequested = Signal(str)
    duplicateRequested = Signal(str)
    removeRequested = Signal(str)
    defaultRequested = Signal(str)
    newVariantRequested = Signal(str)
    convertRequested = Signal(str)
    buildRequested = Signal(str)
    lineageRequested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entry: dict[str, Any] | None = None
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        self.browser.setAccessibleName("Details of the selected entry")
        self.browser.anchorClicked.connect(self._anchor)
        self.checks = ChecksModel(self)
        self.table = QTableView()
        self.table.setModel(self.checks)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(True)
        self.table.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.buttons: dict[str, QPushButton] = {}
        bar = QHBoxLayout()
        for key, label, signal in (
            ("chat", "Chat", self.chatRequested),
            ("compare", "Compare with base", self.compareRequested),
            ("edit", "Edit…", self.editRequested),
            ("duplicate", "Duplicate", self.duplicateRequested),
            ("variant", "New variant…", self.newVariantRequested),
            ("convert", "Add file for the other backend", self.convertRequested),
            ("build", "Build now", self.buildRequested),
            ("default", "Use as default", self.defaultRequested),
            ("copy", "Copy identity", None),
            ("lineage", "Lineage…", self.lineageRequested),
            ("remove", "Remove…", self.removeRequested),
        ):
            button = QPushButton(label)
            if signal is not None:
                button.clicked.connect(lambda _=False, s=signal: self._emit(s))
            self.buttons[key] = button
            bar.addWidget(button)
        self.buttons["copy"].clicked.connect(self._copy_identity)
        bar.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(self.browser, 3)
        layout.addWidget(QLabel("<b>Compatibility and integrity checks</b>"))
        layout.addWidget(self.summary)
        layout.addWidget(self.table, 2)
        self.show_entry(None)

    def _emit(self, signal: Signal) -> None:
        if self.entry:
            signal.emit(self.entry["name"])

    def _anchor(self, url: Any) -> None:
        """A digest's Copy link: the whole digest to the clipboard."""
        scheme, _, value = url.toString().partition(":")
        if scheme == "copy" and DIGEST.match(value):
            QGuiApplication.clipboard().setText(value)

    def _copy_identity(self) -> None:
        if self.entry and self.entry.get("identity"):
            QGuiApplication.clipboard().setText(self.entry["identity"])

    def show_entry(self, entry: dict[str, Any] | None, is_default: bool = False) -> None:
        self.entry = entry
        kind = entry["kind"] if entry else None
        visible = {
            "chat": kind in ("model", "variant"),
            "compare": kind == "variant",
            "edit": kind == "variant",
            "duplicate": kind == "variant",
            "variant": kind == "adapter",
            "convert": kind == "adapter",
            "default": kind in ("model", "variant"),
            "copy": kind in ("model", "variant"),
            "remove": kind is not None,
            "build": False,
            "lineage": kind is not None,
        }
        if entry is not None and entry.get("built") is False:
            # Not built yet: nothing to chat with, remove or copy; only build it.
            visible = dict.fromkeys(visible, False) | {"build": True}
        for key, button in self.buttons.items():
            button.setVisible(visible[key])
        self.buttons["default"].setEnabled(not is_default)
        self.buttons["default"].setText("Default model ✓" if is_default else "Use as default")
        if entry is None:
            self.browser.setHtml("<p style='color:#888'>Select a base model, adapter or "
                                 "variant in the library.</p>")
            self.checks.load([])
            self.summary.setText("")
            return
        self.browser.setHtml(render_html(entry))
        checks = entry.get("checks") or []
        self.checks.load(checks)
        counts = {s: sum(1 for c in checks if c["status"] == s) for s in STATUS_ICONS}
        self.summary.setText(f"{counts['pass']} passed · {counts['warn']} warning(s) · "
                             f"{counts['fail']} failed")
        self.table.resizeRowsToContents()
