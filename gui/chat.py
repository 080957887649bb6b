"""Chat with a base model or variant: conversations per model, kept across restarts.

Each answer is one engine request (`Generate`) whose `Reply` this view holds: its
tokens stream in through the reply's own signals (already throttled), and only the
streaming message is re-rendered, so the window stays responsive. Every answer is
labelled with the model and the short identity that produced it, and its speed. The
answer is kept in the conversation it was asked in, even when the user moves on to
another model or chat before it ends (the old request is stopped). The backend picker
follows catalog changes (`CatalogEvents`): an imported, converted or removed part can
change which backends can serve the model.
"""

from __future__ import annotations

import html
import time
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication, QKeyEvent, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListView,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import resolve
from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog
from engine.errors import StudioError
from engine.formats.templates import Message
from engine.runtime.messages import Generate, Prompt
from engine.state import conversations, settings
from engine.state.conversations import ChatMessage, Conversation
from gui.backend_picker import LABELS, BackendPicker
from gui.catalog_events import CatalogEvents, touches
from gui.engine_client import QtEngineClient, Reply
from gui.render import markdown_html

ConversationId = Qt.ItemDataRole.UserRole + 1


def message_html(message: ChatMessage) -> str:
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
        head = f"<b>{label}</b><span style='color:#888'>{ident}{speed}</span>"
    body = markdown_html(message.content) if message.content else \
        "<span style='color:#888'>…</span>"
    error = (f"<div style='color:#d23c3c'>{html.escape(message.error)}</div>"
             if message.error else "")
    return f"<div style='margin:8px 0'>{head}<div>{body}</div>{error}</div>"


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

    def __init__(self, client: QtEngineClient, catalog: Catalog, events: CatalogEvents,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self.model_name: str | None = None
        self.conversation: Conversation | None = None
        self.reply: Reply | None = None  # the answer being generated
        self._stream_text = ""
        self._stream_start = 0
        self._started = 0.0

        self.list_model = QStandardItemModel(self)
        self.list = QListView()
        self.list.setModel(self.list_model)
        self.list.setEditTriggers(QListView.EditTrigger.NoEditTriggers)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)  # long titles end in "…"
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.selectionModel().currentChanged.connect(self._pick_conversation)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.new_chat)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_chat)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.delete_button)
        left_layout.addLayout(buttons)
        left_layout.addWidget(self.list)

        self.header = QLabel("Choose a model or variant to chat with.")
        self.backend = BackendPicker()
        self.backend.activated.connect(lambda _i: self._render_header())
        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(False)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message…  (Enter to send, Shift+Enter for a new line)")
        self.input.setMaximumHeight(110)
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
        self.status = QLabel("")
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
        top.addWidget(QLabel("served by"))
        top.addWidget(self.backend)
        right_layout.addLayout(top)
        right_layout.addWidget(self.transcript, 1)
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
        self._update_buttons()

    # ---------------------------------------------------------------- conversations

    def set_model(self, name: str | None) -> None:
        if name == self.model_name:
            return
        self._abandon()
        self.model_name = name
        self.backend.set_target(self.catalog, name)
        self._reload_list()
        if name is None:
            self.conversation = None
            self._render()
            return
        existing = conversations.list_all(name)
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

    def _reload_list(self) -> None:
        self.list_model.clear()
        if self.model_name is None:
            return
        for conv in conversations.list_all(self.model_name):
            item = QStandardItem(conv.title)
            item.setData(conv.id, ConversationId)
            item.setToolTip(f"{conv.title}\n" + time.strftime(
                "%Y-%m-%d %H:%M", time.localtime(conv.updated_at)))
            self.list_model.appendRow(item)

    def open_conversation(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self._render()
        for row in range(self.list_model.rowCount()):
            item = self.list_model.item(row)
            if item.data(ConversationId) == conversation.id:
                self.list.setCurrentIndex(item.index())

    def _pick_conversation(self, current: Any, _previous: Any) -> None:
        if not current.isValid() or self.reply:
            return
        conv_id = current.data(ConversationId)
        if self.conversation and conv_id == self.conversation.id:
            return
        loaded = conversations.load(conv_id)
        if loaded:
            self.conversation = loaded
            self._render()

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

    def _save(self) -> None:
        if self.conversation is not None and self.conversation.messages:
            conversations.save(self.conversation)
            self._reload_list()

    # ---------------------------------------------------------------- rendering

    def _render(self) -> None:
        if self.model_name is None or self.conversation is None:
            self.header.setText("Choose a model or variant to chat with.")
            self.transcript.setHtml("")
            self._update_buttons()
            return
        self._render_header()
        self.transcript.setHtml("".join(message_html(m) for m in self.conversation.messages))
        self.transcript.verticalScrollBar().setValue(
            self.transcript.verticalScrollBar().maximum())
        self._update_buttons()

    def _render_header(self) -> None:
        if self.model_name is None:
            return
        try:
            # The identity the next answer will have: the same spec `_start` sends
            # (a base's context size comes from Settings, the backend from the picker).
            short = self._spec().identity.short
            self.header.setText(f"<b>{html.escape(self.model_name)}</b> "
                                f"<span style='color:#888'>identity {short}</span>")
        except StudioError as exc:
            self.header.setText(f"<b>{html.escape(self.model_name)}</b> "
                                f"<span style='color:#d23c3c'>{html.escape(exc.message)}</span>")

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

    # ---------------------------------------------------------------- generation

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.model_name is None or self.conversation is None or self.reply:
            return
        self.input.clear()
        self.conversation = self.conversation.with_messages(
            (*self.conversation.messages, ChatMessage("user", text)))
        self._save()
        self._start()

    def regenerate(self) -> None:
        if self.conversation is None or self.reply:
            return
        messages = list(self.conversation.messages)
        while messages and messages[-1].role == "assistant":
            messages.pop()
        if not messages:
            return
        self.conversation = self.conversation.with_messages(tuple(messages))
        self._save()
        self._start()

    def _spec(self) -> SessionSpec:
        """What the current model is served as: this spec is sent, its identity shown."""
        assert self.model_name is not None
        kind, _record = self.catalog.find(self.model_name)
        # A plain base has no profile: it runs with the context size from Settings.
        n_ctx = settings.load().context_size if kind == "model" else None
        return resolve.resolve(self.catalog, self.model_name, n_ctx, self.backend.backend())

    def _start(self) -> None:
        assert self.conversation is not None and self.model_name is not None
        history = tuple(Message(m.role, m.content)
                        for m in self.conversation.messages if not m.error)
        try:
            spec = self._spec()
            sampling = resolve.sampling(self.catalog, self.model_name)
        except StudioError as exc:
            self._append_answer("", error=exc.message)
            self._render()
            return
        self._render()
        self._stream_text = ""
        cursor = self.transcript.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self._stream_start = cursor.position()
        self._started = time.perf_counter()
        reply = self.client.submit(Generate(spec, Prompt(messages=history, chat=True),
                                            sampling))
        reply.tokens.connect(self._on_tokens)
        reply.finished.connect(self._on_finished)
        reply.failed.connect(self._on_failed)
        reply.cancelled.connect(self._on_cancelled)
        self.reply = reply
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
                                                   model=self.model_name)))
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    @Slot(str, str, list)
    def _on_tokens(self, _side: str, text: str, _tokens: list) -> None:
        self._stream_text += text
        self._render_stream()
        elapsed = time.perf_counter() - self._started
        self.status.setText(f"generating… {len(self._stream_text)} chars, {elapsed:.1f} s")

    def _finish(self) -> None:
        self.reply = None
        self.busyChanged.emit(False)
        self._render()

    def _append_answer(self, text: str, error: str | None = None,
                       result: dict[str, Any] | None = None) -> None:
        assert self.conversation is not None
        message = ChatMessage(
            "assistant", text, model=self.model_name,
            identity=(result or {}).get("identity"),
            tokens_per_second=(result or {}).get("tokens_per_second"), error=error,
            backend=(result or {}).get("backend"))
        self.conversation = self.conversation.with_messages(
            (*self.conversation.messages, message))
        self._save()

    @Slot(object)
    def _on_finished(self, result: Any) -> None:
        self._append_answer(result["text"], result=result)
        self.status.setText(f"{result['name']} · {LABELS.get(result['backend'], '?')} · "
                            f"{result['identity'][:12]} · "
                            f"{result['tokens_per_second']:.1f} tok/s · "
                            f"{len(result['token_ids'])} tokens · {result['finish_reason']}")
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

    def copy_last(self) -> None:
        if self.conversation is None:
            return
        for message in reversed(self.conversation.messages):
            if message.role == "assistant" and message.content:
                QGuiApplication.clipboard().setText(message.content)
                return
