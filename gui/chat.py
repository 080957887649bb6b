"""Chat with a base model or variant: conversations per model, kept across restarts.

Each answer is one engine request (`Generate`) whose `Reply` this view holds: its
tokens stream in through the reply's own signals (already throttled), and only the
streaming message is re-rendered, so the window stays responsive. Every answer is
labelled with the model and the short identity that produced it, and its speed. The
answer is kept in the conversation it was asked in, even when the user moves on to
another model or chat before it ends (the old request is stopped). The backend picker
follows catalog changes (`CatalogEvents`): an imported, converted or removed part can
change which backends can serve the model.

What a chat app is expected to do: conversations can be renamed (double-click or F2),
searched and exported (Markdown, JSON); a sent message can be edited and sent again (a
branch: the old path is kept as another version of that place), an answer regenerated
(a new seed unless the sampling is greedy) with its versions kept (‹ 1/2 ›); each chat
has its own system prompt and sampling ("Chat settings", saved with the conversation).
Answers are Markdown (`gui.markdown`: highlighted code, a Copy link per block). An
empty chat says what the model is for.
"""

from __future__ import annotations

import html
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QUrl, Signal, Slot
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QKeyEvent,
    QPalette,
    QStandardItem,
    QStandardItemModel,
)
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import entries, resolve
from engine.catalog.profiles import Sampling
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.formats.templates import Message
from engine.runtime import assembly
from engine.runtime.messages import Generate, Prompt
from engine.runtime.results import GenerationResult
from engine.state import conversations
from engine.state.conversations import ChatMessage, Conversation
from gui.backend_picker import LABELS, BackendPicker
from gui.catalog_events import CatalogEvents, touches
from gui.controllers.replay import ReplayRunner, verdict_text
from gui.engine_client import QtEngineClient, Reply
from gui.markdown import render
from gui.widgets.elided_label import ElidedLabel

ConversationId = Qt.ItemDataRole.UserRole + 1
LINK = "text-decoration:none"
# The per-chat sampling the panel offers (the rest stays the profile's).
CHAT_SAMPLING = ("temperature", "top_p", "max_tokens", "seed")
STATUS_INTERVAL = 0.5  # s between redraws of the "generating…" line


def _link(href: str, text: str, tip: str = "") -> str:
    title = f" title='{html.escape(tip)}'" if tip else ""
    return f"<a href='{href}' style='{LINK}'{title}>{text}</a>"


def message_html(message: ChatMessage, index: int | None = None, dark: bool = False,
                 code: list[str] | None = None, last: bool = False) -> str:
    """One message; with `index`, its actions as links (edit, versions, copy, and
    regenerate on the last answer); code blocks' texts are appended to `code`."""
    actions = []
    if index is not None and message.versions() > 1:
        actions.append(_link(f"prev:{index}", "‹", "Previous version") +
                       f" {message.version + 1}/{message.versions()} " +
                       _link(f"next:{index}", "›", "Next version"))
    if index is not None and message.role == "user":
        actions.append(_link(f"edit:{index}", "Edit", "Edit and send again (a new branch)"))
    if index is not None and message.role == "assistant" and message.content:
        actions.append(_link(f"copymsg:{index}", "Copy", "Copy this answer"))
        if message.replay:
            actions.append(_link(f"replay:{index}", "Replay", "Regenerate this answer with "
                                 "the same identity, settings and seed, and compare"))
        if last:
            actions.append(_link("regenerate:", "Regenerate", "A new answer (new seed)"))
    if message.role == "user":
        head = "<b>You</b>"
    else:
        label = html.escape(message.model or "assistant")
        if message.backend:
            label += f" <span style='color:#888'>on {LABELS.get(message.backend, '?')}</span>"
        ident = f" · <code>{html.escape((message.identity or '')[:12])}</code>" \
            if message.identity else ""
        speed = f" · {message.tokens_per_second:.1f} tok/s" \
            if message.tokens_per_second else ""
        seed = f" · seed {message.seed}" if message.seed is not None else ""
        cut = " · cut at max tokens" if message.finish_reason == "length" else ""
        head = f"<b>{label}</b><span style='color:#888'>{ident}{speed}{seed}{cut}</span>"
    if actions:
        head += "<span style='color:#888'> &nbsp; " + " · ".join(actions) + "</span>"
    if message.content:
        rendered = render(message.content, dark, len(code) if code is not None else 0,
                          copy_links=code is not None)
        if code is not None:
            code.extend(rendered.code)
        body = rendered.html
    else:
        body = "<span style='color:#888'>…</span>"
    error = (f"<div style='color:#d23c3c'>{html.escape(message.error)}</div>"
             if message.error else "")
    return f"<div style='margin:8px 0'>{head}<div>{body}</div>{error}</div>"


def purpose_html(catalog: Catalog, name: str) -> str:
    """What a model is for, for its empty chat: the variant's description, or its
    system prompt and its adapters' source and training."""
    try:
        kind, record = catalog.find(name)
    except StudioError:
        return ""
    esc = html.escape
    parts = []
    if record.get("description"):
        parts.append(esc(str(record["description"])))
    if kind == "model":
        meta = record.get("metadata") or {}
        arch = esc(str(meta.get("architecture", "?")))
        parts.append(f"<b>{esc(name)}</b> is a base model ({arch}, "
                     f"{esc(str(meta.get('file_type', '')))}) with no adapter: the "
                     "reference every variant of it is compared with.")
    else:
        adapters = ", ".join(f"{esc(a['name'])} at scale {a['scale']:g}"
                             for a in record.get("adapters", []))
        parts.append(f"<b>{esc(name)}</b> is {esc(record['base'])} with {adapters}.")
        system = (record.get("profile") or {}).get("system_prompt")
        if system:
            parts.append(f"Its system prompt: <i>“{esc(system)}”</i>")
        for a in record.get("adapters", []):
            try:
                adapter = catalog.adapter(a["name"])
            except StudioError:
                continue
            facts = []
            if adapter.get("source"):
                facts.append(esc(str(adapter["source"])))
            provenance = adapter.get("provenance")
            if isinstance(provenance, dict) and provenance:
                try:
                    lines = entries.provenance_lines(provenance)
                except (KeyError, TypeError, ValueError, AttributeError):
                    lines = []
                for line in lines:
                    key, _, value = line.partition(": ")
                    if key == "data_sha256" and "(" in value:
                        facts.append("trained on " + esc(value[value.index("(") + 1:]
                                                         .rstrip(")")))
                    elif key in ("method", "loss"):
                        facts.append(f"{esc(key)} {esc(value)}")
            if facts:
                parts.append(f"Adapter {esc(a['name'])}: " + "; ".join(facts) + ".")
    return ("<div style='color:#888;margin:24px 8px'>" + "<br><br>".join(parts) +
            "<br><br>Ask it something below.</div>")


class _EnterToSend(QObject):
    """Enter sends, Shift+Enter adds a line."""

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent)
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self._send()
            return True
        return False


class ChatView(QWidget):
    busyChanged = Signal(bool)
    answered = Signal()
    replayed = Signal(dict)  # the verdict of a Replay (gui.controllers.replay)

    def __init__(self, client: QtEngineClient, catalog: Catalog, events: CatalogEvents,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.model_name: str | None = None
        self._listed: list[Conversation] | None = None  # the conversations read last
        self.conversation: Conversation | None = None
        self.reply: Reply | None = None  # the answer being generated
        self._stream_text = ""
        self._stream_start = 0
        self._started = 0.0
        # When the last answer's first token was shown (seconds after it was asked for),
        # and when the status line was last redrawn while streaming.
        self.first_token_seconds: float | None = None
        self._status_at = 0.0
        self._sampling: Sampling | None = None  # of the answer being generated
        # A regenerated answer becomes a new version at this place of this conversation.
        self._branch: tuple[int, Conversation] | None = None
        self._editing: int | None = None  # the user message being edited, if any
        self._code: list[str] = []  # the code blocks shown, for their Copy links

        self.list_model = QStandardItemModel(self)
        self.list = QListView()
        self.list.setModel(self.list_model)
        # Renamed in place: double-click or F2.
        self.list.setEditTriggers(QListView.EditTrigger.DoubleClicked |
                                  QListView.EditTrigger.EditKeyPressed)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)  # long titles end in "…"
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setAccessibleName("Conversations")
        self.list.selectionModel().currentChanged.connect(self._pick_conversation)
        self.list_model.itemChanged.connect(self._renamed)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats…")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search conversations")
        # A keystroke filters the list read last; it does not read every file again.
        self.search.textChanged.connect(lambda _t: self._reload_list(refresh=False))
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.new_chat)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_chat)
        self.rename_button = QPushButton("Rename")
        self.rename_button.setToolTip("Rename this conversation (F2)")
        self.rename_button.clicked.connect(self.rename_chat)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save this conversation as Markdown or JSON")
        self.export_button.clicked.connect(lambda: self.export_chat())
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.delete_button)
        more = QHBoxLayout()
        more.addWidget(self.rename_button)
        more.addWidget(self.export_button)
        left_layout.addLayout(buttons)
        left_layout.addWidget(self.search)
        left_layout.addWidget(self.list)
        left_layout.addLayout(more)

        self.header = ElidedLabel("Choose a model or variant to chat with.")
        self.backend = BackendPicker()
        self.backend.activated.connect(lambda _i: self._render_header())
        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(False)
        self.transcript.setOpenLinks(False)
        self.transcript.setAccessibleName("Conversation")
        self.transcript.anchorClicked.connect(self._anchor)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message…  (Enter to send, Shift+Enter for a new line)")
        self.input.setMaximumHeight(110)
        self.input.setAccessibleName("Message")
        self.editing_label = QLabel()
        self.editing_label.setStyleSheet("color:#c07a00")
        self.cancel_edit = QPushButton("Cancel edit")
        self.cancel_edit.clicked.connect(self.stop_editing)
        editing_row = QHBoxLayout()
        editing_row.addWidget(self.editing_label, 1)
        editing_row.addWidget(self.cancel_edit)
        self.editing_label.hide()
        self.cancel_edit.hide()

        # This chat's own system prompt and sampling (None: the profile's).
        self.settings_toggle = QToolButton()
        self.settings_toggle.setText("Chat settings")
        self.settings_toggle.setCheckable(True)
        self.settings_toggle.setToolTip("This conversation's system prompt and sampling")
        self.settings_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.settings_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.settings_toggle.toggled.connect(self._toggle_settings)
        self.settings_box = QGroupBox("This chat (saved with it)")
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setMaximumHeight(70)
        self.system_prompt.setAccessibleName("System prompt of this chat")
        self.chat_temperature = QDoubleSpinBox()
        self.chat_temperature.setRange(0.0, 5.0)
        self.chat_temperature.setSingleStep(0.1)
        self.chat_temperature.setToolTip("0 = greedy (the same answer every time)")
        self.chat_top_p = QDoubleSpinBox()
        self.chat_top_p.setRange(0.0, 1.0)
        self.chat_top_p.setSingleStep(0.05)
        self.chat_max_tokens = QSpinBox()
        self.chat_max_tokens.setRange(1, 32768)
        self.chat_seed = QSpinBox()
        self.chat_seed.setRange(0, 2**31 - 1)
        self.reset_settings = QPushButton("Use the model's profile")
        self.reset_settings.clicked.connect(self._reset_settings)
        settings_form = QFormLayout(self.settings_box)
        settings_form.addRow("System prompt", self.system_prompt)
        sampling_row = QHBoxLayout()
        for label, widget in (("temperature", self.chat_temperature),
                              ("top-p", self.chat_top_p),
                              ("max tokens", self.chat_max_tokens), ("seed", self.chat_seed)):
            sampling_row.addWidget(QLabel(label))
            sampling_row.addWidget(widget)
        sampling_row.addStretch(1)
        sampling_row.addWidget(self.reset_settings)
        settings_form.addRow(sampling_row)
        self.settings_box.hide()
        self._loading_settings = False
        self.system_prompt.textChanged.connect(self._settings_edited)
        for spin in (self.chat_temperature, self.chat_top_p, self.chat_max_tokens,
                     self.chat_seed):
            spin.valueChanged.connect(self._settings_edited)
        self._enter = _EnterToSend(self.send)
        self.input.installEventFilter(self._enter)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.clicked.connect(self.stop)
        self.regen_button = QPushButton("Regenerate")
        self.regen_button.clicked.connect(self.regenerate)
        self.copy_button = QPushButton("Copy answer")
        self.copy_button.clicked.connect(self.copy_last)
        # Elided, never wider than it is given: a long line cannot move the splitters.
        self.status = ElidedLabel("")
        row = QHBoxLayout()
        row.addWidget(self.status, 1)
        for button in (self.copy_button, self.regen_button, self.stop_button,
                       self.send_button):
            row.addWidget(button)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.header, 1)
        top.addWidget(self.settings_toggle)
        top.addWidget(QLabel("served by"))
        top.addWidget(self.backend)
        right_layout.addLayout(top)
        right_layout.addWidget(self.settings_box)
        right_layout.addWidget(self.transcript, 1)
        right_layout.addLayout(editing_row)
        right_layout.addWidget(self.input)
        right_layout.addLayout(row)
        self.splitter = QSplitter()
        self.splitter.addWidget(left)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 4)
        self.splitter.setSizes([180, 700])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)

        events.catalogChanged.connect(self._catalog_changed)
        self.replayer = ReplayRunner(client, catalog, self)
        self.replayer.verdict.connect(self._replayed)
        self.last_replay: dict | None = None
        self._update_buttons()

    # ---------------------------------------------------------------- conversations

    def set_model(self, name: str | None) -> None:
        if name == self.model_name:
            return
        self._abandon()
        self.model_name = name
        self.backend.set_target(self.catalog, name)
        self.conversation = None
        self._reload_list()
        if name is None:
            self._render()
            self._footer()
            return
        existing = self._listed
        self.open_conversation(existing[0] if existing else conversations.new(name))

    def _catalog_changed(self, kinds: list[str], names: list[str]) -> None:
        """Which backends can serve the current model may have changed (a part was
        imported, converted or removed), or the model itself was removed or edited."""
        if self.model_name is None or not touches(kinds, ("model", "adapter", "variant")):
            return
        try:
            self.catalog.find(self.model_name)
        except StudioError:  # removed: nothing to chat with (the window selects another)
            self.set_model(None)
            return
        if self.reply is None:
            self.backend.set_target(self.catalog, self.model_name)
            self._render_header()

    def _reload_list(self, refresh: bool = True) -> None:
        """Fill the list: from the conversation files (`refresh`), else from the ones
        read last (a search keystroke)."""
        if refresh or self._listed is None:
            self._listed = conversations.list_all(self.model_name) \
                if self.model_name is not None else []
        # Not blockSignals: the list view must hear of the rows; a flag tells the
        # rename and pick handlers that this is a reload, not the user.
        self._listing = True
        try:
            self._fill_list()
        finally:
            self._listing = False
        if self.conversation is not None:
            self._select_in_list(self.conversation.id)

    def _fill_list(self) -> None:
        self.list_model.clear()
        if self.model_name is None:
            return
        query = self.search.text().strip()
        found = [c for c in self._listed or () if not query or c.matches(query)]
        for conv in found:
            item = QStandardItem(conv.title)
            item.setData(conv.id, ConversationId)
            item.setToolTip(f"{conv.title}\n" + time.strftime(
                "%Y-%m-%d %H:%M", time.localtime(conv.updated_at)))
            self.list_model.appendRow(item)
        if query and not found:
            item = QStandardItem("no matches")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list_model.appendRow(item)

    def _select_in_list(self, conversation_id: str) -> None:
        for row in range(self.list_model.rowCount()):
            item = self.list_model.item(row)
            if item.data(ConversationId) == conversation_id:
                self._listing = True
                try:
                    self.list.setCurrentIndex(item.index())
                finally:
                    self._listing = False

    def _renamed(self, item: QStandardItem) -> None:
        conv_id = item.data(ConversationId)
        if not conv_id or getattr(self, "_listing", False):
            return
        loaded = self.conversation if self.conversation and self.conversation.id == conv_id \
            else conversations.load(conv_id)
        if loaded is None:
            return
        renamed = loaded.renamed(item.text())
        conversations.save(renamed)
        if self.conversation is not None and self.conversation.id == conv_id:
            self.conversation = renamed
        self._reload_list()

    def rename_chat(self, title: str | None = None) -> None:
        """Rename the current conversation: to `title`, or in place in the list."""
        if self.conversation is None:
            return
        if title is not None:
            self.conversation = self.conversation.renamed(title)
            conversations.save(self.conversation)
            self._reload_list()
            return
        if not self.conversation.messages:
            self._save(force=True)  # an empty chat is listed once it is named
        for row in range(self.list_model.rowCount()):
            item = self.list_model.item(row)
            if item.data(ConversationId) == self.conversation.id:
                self.list.setFocus()
                self.list.edit(item.index())

    def export_chat(self, path: str | None = None) -> str | None:
        """Save the conversation as Markdown (.md) or JSON (.json); returns the path."""
        if self.conversation is None:
            return None
        if path is None:
            stem = "".join(c if c.isalnum() or c in "-_ " else "_"
                           for c in self.conversation.title).strip() or "chat"
            path, chosen = QFileDialog.getSaveFileName(
                self, "Export conversation", f"{stem}.md",
                "Markdown (*.md);;JSON (*.json)")
            if not path:
                return None
            if not Path(path).suffix:
                path += ".json" if chosen.startswith("JSON") else ".md"
        text = self.conversation.to_json() if path.lower().endswith(".json") else \
            self.conversation.to_markdown()
        Path(path).write_text(text, encoding="utf-8")
        self.status.setText(f"exported to {path}")
        return path

    def open_conversation(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.stop_editing()
        self._load_settings()
        self._render()
        self._footer()
        self._select_in_list(conversation.id)

    def _pick_conversation(self, current: Any, _previous: Any) -> None:
        if not current.isValid() or self.reply or getattr(self, "_listing", False):
            return
        conv_id = current.data(ConversationId)
        if self.conversation and conv_id == self.conversation.id:
            return
        loaded = conversations.load(conv_id) if conv_id else None
        if loaded:
            self.conversation = loaded
            self.stop_editing()
            self._load_settings()
            self._render()
            self._footer()

    def new_chat(self) -> None:
        if self.model_name is None:
            return
        self._abandon()
        self.open_conversation(conversations.new(self.model_name))
        self.input.setFocus()

    def delete_chat(self) -> None:
        if self.conversation is None or self.reply:
            return
        conversations.delete(self.conversation.id)
        self.conversation = None
        self._reload_list()
        model, self.model_name = self.model_name, None
        self.set_model(model)

    def _save(self, force: bool = False) -> None:
        if self.conversation is not None and (self.conversation.messages or force):
            conversations.save(self.conversation)
            self._reload_list()

    def _footer(self) -> None:
        """The footer of the conversation on show: its last answer's figures, or
        nothing (never another model's or chat's)."""
        last = next((m for m in reversed(self.conversation.messages)
                     if m.role == "assistant"), None) if self.conversation else None
        if last is None or self.reply is not None:
            self.status.setText("")
            return
        parts = [last.model or "", f"{(last.identity or '')[:12]}"]
        if last.tokens_per_second:
            parts.append(f"{last.tokens_per_second:.1f} tok/s")
        if last.error:
            parts.append(last.error)
        self.status.setText("last answer: " + " · ".join(p for p in parts if p))

    # ---------------------------------------------------------------- chat settings

    def _toggle_settings(self, shown: bool) -> None:
        self.settings_box.setVisible(shown)
        self.settings_toggle.setArrowType(Qt.ArrowType.DownArrow if shown
                                          else Qt.ArrowType.RightArrow)

    def _profile_sampling(self) -> tuple[str, Sampling] | None:
        if self.model_name is None:
            return None
        try:
            profile = resolve.profile(self.catalog, self.model_name)
            return (str(profile.get("system_prompt") or ""),
                    resolve.sampling(self.catalog, self.model_name))
        except StudioError:
            return None

    def _load_settings(self) -> None:
        """Show the conversation's settings (the profile's where it has none)."""
        defaults = self._profile_sampling()
        if defaults is None or self.conversation is None:
            return
        system, sampling = defaults
        own = self.conversation.sampling or {}
        self._loading_settings = True
        self.system_prompt.setPlaceholderText(system or "no system prompt")
        self.system_prompt.setPlainText(self.conversation.system_prompt
                                        if self.conversation.system_prompt is not None
                                        else system)
        self.chat_temperature.setValue(float(own.get("temperature", sampling.temperature)))
        self.chat_top_p.setValue(float(own.get("top_p", sampling.top_p)))
        self.chat_max_tokens.setValue(int(own.get("max_tokens", sampling.max_tokens)))
        self.chat_seed.setValue(int(own.get("seed", sampling.seed)))
        self._loading_settings = False
        custom = self.conversation.system_prompt is not None or bool(own)
        self.settings_toggle.setText("Chat settings (custom)" if custom else "Chat settings")

    def _settings_edited(self) -> None:
        if self._loading_settings or self.conversation is None:
            return
        defaults = self._profile_sampling()
        if defaults is None:
            return
        system, sampling = defaults
        values = {"temperature": round(self.chat_temperature.value(), 4),
                  "top_p": round(self.chat_top_p.value(), 4),
                  "max_tokens": self.chat_max_tokens.value(), "seed": self.chat_seed.value()}
        # Only what differs from the profile is the chat's own: a later profile edit
        # still reaches the settings the user did not touch.
        own = {k: v for k, v in values.items() if v != getattr(sampling, k)}
        typed = self.system_prompt.toPlainText()
        self.conversation = self.conversation.with_settings(
            typed if typed != system else None, own)
        self._save(force=True)
        custom = self.conversation.system_prompt is not None or bool(own)
        self.settings_toggle.setText("Chat settings (custom)" if custom else "Chat settings")

    def _reset_settings(self) -> None:
        if self.conversation is None:
            return
        self.conversation = self.conversation.with_settings(None, None)
        self._save(force=True)
        self._load_settings()

    # ---------------------------------------------------------------- rendering

    def _render(self) -> None:
        if self.model_name is None or self.conversation is None:
            self.header.setText("Choose a model or variant to chat with.")
            self.transcript.setHtml("")
            self._update_buttons()
            return
        self._render_header()
        self._code = []
        messages = self.conversation.messages
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        busy = self.reply is not None
        body = "".join(message_html(m, None if busy else i, self._dark(), self._code,
                                    last=i == last) for i, m in enumerate(messages))
        if not messages and not busy:
            body = purpose_html(self.catalog, self.model_name)
        self.transcript.setHtml(body)
        self.transcript.verticalScrollBar().setValue(
            self.transcript.verticalScrollBar().maximum())
        self._update_buttons()

    def _dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def _render_header(self) -> None:
        if self.model_name is None:
            return
        try:
            # The identity the next answer will have: the same spec `_start` sends
            # (a base's context size comes from Settings, the backend from the picker).
            short = self._spec().identity.short
            self.header.setText(f"{self.model_name} · identity {short}")
            self.header.setStyleSheet("font-weight:bold")
        except StudioError as exc:
            self.header.setText(f"{self.model_name} · {exc.message}")
            self.header.setStyleSheet("font-weight:bold;color:#d23c3c")

    def _update_buttons(self) -> None:
        busy = self.reply is not None
        has_model = self.model_name is not None
        messages = self.conversation.messages if self.conversation else ()
        self.send_button.setEnabled(has_model and not busy)
        self.stop_button.setEnabled(busy)
        self.regen_button.setEnabled(not busy and any(m.role == "user" for m in messages))
        self.copy_button.setEnabled(any(m.role == "assistant" and m.content
                                        for m in messages))
        self.input.setEnabled(has_model)
        has_chat = self.conversation is not None
        self.rename_button.setEnabled(has_chat and not busy)
        self.export_button.setEnabled(bool(messages))
        self.delete_button.setEnabled(has_chat and not busy)
        self.settings_box.setEnabled(has_chat and not busy)

    # ---------------------------------------------------------------- generation

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.model_name is None or self.conversation is None or self.reply:
            return
        self.input.clear()
        editing, self._editing = self._editing, None
        self.stop_editing()
        if editing is not None and editing < len(self.conversation.messages):
            # Edited and sent again: a new branch from that message; the old path stays
            # as another version of it.
            self.conversation = self.conversation.branch(editing, (ChatMessage("user", text),))
        else:
            self.conversation = self.conversation.with_messages(
                (*self.conversation.messages, ChatMessage("user", text)))
        # The request goes out first: saving (an fsync'd write, ~20-30 ms) happens while
        # the engine reads the prompt, not before it is asked.
        self._start()
        self._save()

    def edit_message(self, index: int) -> None:
        """Put user message `index` in the composer; sending it makes a branch."""
        if self.conversation is None or self.reply or \
                not 0 <= index < len(self.conversation.messages) or \
                self.conversation.messages[index].role != "user":
            return
        self._editing = index
        self.input.setPlainText(self.conversation.messages[index].content)
        self.editing_label.setText(f"Editing message {index + 1}: Send makes a new branch "
                                   "(the old one is kept as a version).")
        self.editing_label.show()
        self.cancel_edit.show()
        self.input.setFocus()

    def stop_editing(self) -> None:
        if self._editing is not None:
            self.input.clear()
        self._editing = None
        self.editing_label.hide()
        self.cancel_edit.hide()

    def regenerate(self) -> None:
        """A new answer to the last question, kept beside the old one (‹ 1/2 ›), with a
        new seed unless the sampling is greedy (which would give the same answer)."""
        if self.conversation is None or self.reply:
            return
        messages = self.conversation.messages
        index = len(messages)
        while index > 0 and messages[index - 1].role == "assistant":
            index -= 1
        if index == 0:
            return
        if index < len(messages):
            self._branch = (index, self.conversation)
            self.conversation = replace(self.conversation, messages=messages[:index])
        self._start(fresh_seed=True)

    def switch_version(self, index: int, step: int) -> None:
        if self.conversation is None or self.reply or \
                not 0 <= index < len(self.conversation.messages):
            return
        message = self.conversation.messages[index]
        target = message.version + step
        if not 0 <= target < message.versions():
            return
        self.conversation = self.conversation.switch(index, target)
        self._save()
        self._render()
        self._footer()

    def _anchor(self, url: QUrl) -> None:
        """The transcript's links: actions on a message, a code block's Copy, links."""
        scheme, _, rest = url.toString().partition(":")
        try:
            number = int(rest) if rest else -1
        except ValueError:
            number = -1
        if scheme == "copy" and 0 <= number < len(self._code):
            QGuiApplication.clipboard().setText(self._code[number])
            self.status.setText("code copied")
        elif scheme == "copymsg" and self.conversation and \
                0 <= number < len(self.conversation.messages):
            QGuiApplication.clipboard().setText(self.conversation.messages[number].content)
            self.status.setText("answer copied")
        elif scheme == "edit":
            self.edit_message(number)
        elif scheme in ("prev", "next"):
            self.switch_version(number, -1 if scheme == "prev" else 1)
        elif scheme == "regenerate":
            self.regenerate()
        elif scheme == "replay":
            self.replay_message(number)
        elif scheme in ("http", "https"):
            QDesktopServices.openUrl(url)

    def _spec(self) -> SessionSpec:
        """What the current model is served as: the spec `request` sends, whose identity
        the header shows (a plain base's context size from Settings, as everywhere)."""
        assert self.model_name is not None
        return assembly.spec(self.catalog, self.model_name, backend=self.backend.backend())

    def request(self, history: tuple[Message, ...], fresh_seed: bool = False) -> Generate:
        """The next answer's request (`runtime.assembly`, as every front end builds it):
        the profile's sampling with this chat's own settings, and a new seed for a
        regenerate (unless greedy: the seed changes nothing then)."""
        assert self.model_name is not None
        own = {k: v for k, v in ((self.conversation.sampling or {}) if self.conversation
                                 else {}).items() if k in CHAT_SAMPLING}
        system = self.conversation.system_prompt if self.conversation else None
        request = assembly.request(self.catalog, self.model_name,
                                   Prompt(messages=history, chat=True, system=system),
                                   backend=self.backend.backend(), **own)
        if fresh_seed and not request.sampling.greedy:
            request = assembly.with_seed(request, random.randrange(2**31))
        return request

    @staticmethod
    def _history(messages: tuple[ChatMessage, ...] | list[ChatMessage]) -> tuple[Message, ...]:
        """What an answer is asked from: the messages before it, failed answers left out."""
        return tuple(Message(m.role, m.content) for m in messages if not m.error)

    def _start(self, fresh_seed: bool = False) -> None:
        assert self.conversation is not None and self.model_name is not None
        history = self._history(self.conversation.messages)
        try:
            # The system prompt: this chat's own, else None (the profile's, in the spec).
            request = self.request(history, fresh_seed)
        except StudioError as exc:
            self._sampling = None
            self._append_answer("", error=exc.message)
            self._render()
            return
        self._sampling = request.sampling
        self._stream_text = ""
        self._started = time.perf_counter()
        self.first_token_seconds = None
        reply = self.client.submit(request)
        self.reply = reply  # before rendering: no actions on messages while it runs
        self._render()
        cursor = self.transcript.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        # The answer streams into a block of its own: inserted at the end of the last
        # block, its header would be glued to the user's text until it is re-rendered.
        cursor.insertBlock()
        self._stream_start = cursor.position()
        reply.tokens.connect(self._on_tokens)
        reply.finished.connect(self._on_finished)
        reply.failed.connect(self._on_failed)
        reply.cancelled.connect(self._on_cancelled)
        self.status.setText("generating…")
        self._render_stream()
        self._update_buttons()
        self.busyChanged.emit(True)

    def stop(self) -> None:
        if self.reply is not None:
            self.reply.stop()

    def _abandon(self) -> None:
        """The user moves on while an answer is generated: stop it, and keep what came
        so far, marked stopped, in the conversation it was asked in."""
        reply = self.reply
        if reply is None:
            return
        for signal, slot in ((reply.tokens, self._on_tokens),
                             (reply.finished, self._on_finished),
                             (reply.failed, self._on_failed),
                             (reply.cancelled, self._on_cancelled)):
            signal.disconnect(slot)
        reply.stop()
        self._append_answer(self._stream_text, error="stopped")
        self.status.setText("stopped")
        self._finish()

    def _render_stream(self) -> None:
        cursor = self.transcript.textCursor()
        cursor.setPosition(self._stream_start)
        cursor.movePosition(cursor.MoveOperation.End, cursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.insertHtml(message_html(ChatMessage("assistant", self._stream_text,
                                                   model=self.model_name), dark=self._dark()))
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    @Slot(str, str, list)
    def _on_tokens(self, _side: str, text: str, _tokens: list) -> None:
        self._stream_text += text
        self._render_stream()
        now = time.perf_counter()
        if self.first_token_seconds is None:
            self.first_token_seconds = now - self._started
        # Twice a second is enough for a running count, and a label's new text makes
        # every layout up to the window recompute (several ms offscreen, CPU the engine
        # needs on a small machine).
        if now - self._status_at >= STATUS_INTERVAL:
            self._status_at = now
            self.status.setText(f"generating… {len(self._stream_text)} chars, "
                                f"{now - self._started:.1f} s")

    def _finish(self) -> None:
        self.reply = None
        self.busyChanged.emit(False)
        self._render()

    def _append_answer(self, text: str, error: str | None = None,
                       result: GenerationResult | None = None) -> None:
        assert self.conversation is not None
        message = ChatMessage(
            "assistant", text, model=self.model_name,
            identity=result.identity if result else None,
            tokens_per_second=result.tokens_per_second if result else None, error=error,
            backend=result.backend if result else None,
            seed=self._sampling.seed if self._sampling else None,
            finish_reason=result.finish_reason if result else None,
            replay=_without_messages(result.replay if result else None))
        branch, self._branch = self._branch, None
        if branch is not None and branch[1].id == self.conversation.id:
            index, before = branch
            self.conversation = replace(before, system_prompt=self.conversation.system_prompt,
                                        sampling=self.conversation.sampling
                                        ).branch(index, (message,))
        else:
            self.conversation = self.conversation.with_messages(
                (*self.conversation.messages, message))
        self._save()

    @Slot(object)
    def _on_finished(self, result: GenerationResult) -> None:
        self._append_answer(result.text, result=result)
        # The name asked for: the engine reports its session's, which is shared by every
        # name of one identity (two variants with the same parts).
        finish = result.finish_reason
        self.status.setText(f"{self.model_name} · {LABELS.get(result.backend, '?')} · "
                            f"{result.identity[:12]} · "
                            f"{result.tokens_per_second:.1f} tok/s · "
                            f"{len(result.token_ids)} tokens · "
                            + (f"first token {self.first_token_seconds:.2f} s · "
                               if self.first_token_seconds is not None else "")
                            + ("cut at max tokens" if finish == "length" else finish or ""))
        self._finish()
        self.answered.emit()

    @Slot()
    def _on_cancelled(self) -> None:
        self._append_answer(self._stream_text, error="stopped")
        self.status.setText("stopped")
        self._finish()

    @Slot(str, list)
    def _on_failed(self, message: str, _details: list) -> None:
        self._append_answer(self._stream_text, error=message)
        self.status.setText("failed")
        self._finish()

    def replay_message(self, index: int) -> None:
        """Regenerate answer `index` from its replay record; the verdict goes to the
        status line (and `replayed`)."""
        if self.conversation is None or not 0 <= index < len(self.conversation.messages):
            return
        record = self.conversation.messages[index].replay
        if not record or self.replayer.running():
            return
        # The record leaves out the messages it was asked from (they are the
        # conversation up to this answer: storing them in every answer would make a
        # conversation file grow with the square of its length).
        record = {**record, "prompt": {**record["prompt"], "messages": [
            {"role": m.role, "content": m.content}
            for m in self._history(self.conversation.messages[:index])]}}
        self.status.setText("replaying…")
        self.replayer.replay(record)

    def _replayed(self, found: dict) -> None:
        self.last_replay = found
        self.status.setText(verdict_text(found))
        self.status.setToolTip("\n".join(found.get("identity_changes") or []))
        self.replayed.emit(found)

    def copy_last(self) -> None:
        if self.conversation is None:
            return
        for message in reversed(self.conversation.messages):
            if message.role == "assistant" and message.content:
                QGuiApplication.clipboard().setText(message.content)
                return


def _without_messages(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A replay record as a chat answer keeps it: without the conversation's messages
    (see `ChatView.replay_message`; the prompt's token digest still checks them)."""
    if not record or not isinstance(record.get("prompt"), dict):
        return record
    return {**record, "prompt": {**record["prompt"], "messages": []}}
