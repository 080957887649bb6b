"""Chat with a base model or variant: conversations per model, kept across restarts.

The view of `gui.controllers.chat.ChatController`, which owns the conversation, its
branches and versions, the requests and what is kept of each answer: this widget lays
out the list, the transcript and the composer, forwards the user's actions and draws
what the controller reports (`ChatListener`). Messages become HTML in `gui.render`.

Each answer streams in through its request's own `Reply` (already throttled). It is
drawn at the end of the transcript by a `StreamRegion`: its label once, then each
finished Markdown block once (`gui.render.StreamingMarkdown`), and only the unfinished
block at the end again at each delivery, so a frame costs the same however long the
answer has grown; the finished answer is drawn whole, with its actions. The backend
picker follows catalog changes (`CatalogEvents`): an imported, converted or removed part
can change which backends can serve the model.

What a chat app is expected to do: conversations can be renamed (double-click or F2),
searched and exported (Markdown, JSON); a sent message can be edited and sent again (a
branch: the old path is kept as another version of that place), an answer regenerated
(a new seed unless the sampling is greedy) with its versions kept (‹ 1/2 ›); each chat
has its own system prompt and sampling ("Chat settings", saved with the conversation),
and its own tools ("Tools…": OpenAI function tools as JSON and the tool choice, saved
with it, `ToolsDialog`). An answer's tool calls are cards with a "Reply with result"
link: the composer then writes that call's result, and Send adds it (the model goes on
once every call of the answer has its result).
Answers are Markdown (`gui.markdown`: highlighted code, a Copy link per block; an answer
that is one JSON value is shown formatted, as code). An empty chat says what the model
is for.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QUrl, Signal
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QKeyEvent,
    QPalette,
    QStandardItem,
    QStandardItemModel,
)
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
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

from engine.catalog.resolve import SessionSpec
from engine.catalog.store import Catalog
from engine.curated import demo
from engine.state.conversations import Conversation
from gui.backend_picker import BackendPicker
from gui.catalog_events import CatalogEvents, touches
from gui.controllers.chat import ChatController
from gui.controllers.replay import ReplayRunner, verdict_text
from gui.engine_client import QtEngineClient, Reply
from gui.render import (
    EMPTY_BODY,
    StreamFrame,
    StreamingMarkdown,
    message_html,
    purpose_html,
    streaming_head_html,
    streaming_markdown,
    transcript_html,
)
from gui.widgets.elided_label import ElidedLabel
from gui.widgets.stream_region import StreamRegion

__all__ = ["ChatView", "message_html", "purpose_html"]  # message_html: older callers

ConversationId = Qt.ItemDataRole.UserRole + 1


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


TOOLS_PLACEHOLDER = """[{"type": "function", "function": {
  "name": "get_weather", "description": "The weather in a city now.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                 "required": ["city"]}}}]"""


class ToolsDialog(QDialog):
    """The conversation's tools: OpenAI function tools as JSON, and the tool choice
    (auto: the model decides; required: it must call one; none; or a tool's name).
    OK saves them with the conversation (`ChatController.set_tools`), or says what is
    wrong and stays open."""

    def __init__(self, controller: ChatController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.setWindowTitle("Tools of this chat")
        self.text = QPlainTextEdit(controller.tools_text())
        self.text.setPlaceholderText(TOOLS_PLACEHOLDER)
        self.text.setAccessibleName("Tools as OpenAI function JSON")
        self.choice = QComboBox()
        self.choice.setEditable(True)  # a tool's name may be typed
        self.choice.addItems(["auto", "required", "none"])
        conversation = controller.conversation
        self.choice.setCurrentText(conversation.tool_choice if conversation else "auto")
        self.choice.setToolTip("auto: the model decides; required: it must call a tool; "
                               "none: the tools are left out; or a tool's name")
        self.error = QLabel()
        self.error.setStyleSheet("color:#d23c3c")
        self.error.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok |
                                   QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.apply)
        buttons.rejected.connect(self.reject)
        # The shipped demo variant's tools, for a first try (it answers them as calls).
        self.demo_button = buttons.addButton("Use the demo's tools",
                                             QDialogButtonBox.ButtonRole.ActionRole)
        self.demo_button.setToolTip("The five tools the demo variant tool-calls was "
                                    "trained to call: get_weather, set_timer, send_email, "
                                    "play_music, convert_currency")
        self.demo_button.clicked.connect(lambda: self.text.setPlainText(
            json.dumps(demo.TOOLS, indent=2, ensure_ascii=False)))
        form = QFormLayout(self)
        form.addRow(QLabel("The functions the model may call (a JSON list of OpenAI "
                           "tools; empty: none). Saved with this chat."))
        form.addRow(self.text)
        form.addRow("Tool choice", self.choice)
        form.addRow(self.error)
        form.addRow(buttons)
        self.resize(560, 420)

    def apply(self) -> bool:
        """Save the tools; False (and the reason shown) when they are refused."""
        error = self.controller.set_tools(self.text.toPlainText(),
                                          self.choice.currentText().strip() or "auto")
        if error:
            self.error.setText(error)
            return False
        self.accept()
        return True


class ChatView(QWidget):
    busyChanged = Signal(bool)
    answered = Signal()
    replayed = Signal(dict)  # the verdict of a Replay (gui.controllers.replay)

    def __init__(self, client: QtEngineClient, catalog: Catalog, events: CatalogEvents,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.catalog = catalog
        self._code: list[str] = []  # the code blocks shown, for their Copy links
        self._drawn_dark: bool | None = None  # the theme the transcript was drawn for
        self._listing = False  # the list is being filled (not the user's doing)
        self._stream: StreamingMarkdown | None = None  # the answer being drawn
        self._region: StreamRegion | None = None
        self.backend = BackendPicker()
        self.controller = ChatController(client, catalog, self, backend=self.backend.backend)

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
        self.search.textChanged.connect(lambda _t: self.show_list())
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
        self.tools_button = QPushButton("Tools…")
        self.tools_button.setToolTip("The functions this chat's model may call (OpenAI "
                                     "function JSON), saved with the chat")
        self.tools_button.clicked.connect(self.open_tools)
        self.tools_dialog: ToolsDialog | None = None
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
        # A line of its own under the transcript (beside the buttons it was cut at
        # "first tok…" on a 1024 px window), the figures first.
        self.status = ElidedLabel("")
        self.status.setAccessibleName("Last answer")
        row = QHBoxLayout()
        row.addStretch(1)
        for button in (self.copy_button, self.regen_button, self.stop_button,
                       self.send_button):
            row.addWidget(button)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.header, 1)
        top.addWidget(self.settings_toggle)
        top.addWidget(self.tools_button)
        top.addWidget(QLabel("served by"))
        top.addWidget(self.backend)
        right_layout.addLayout(top)
        right_layout.addWidget(self.settings_box)
        right_layout.addWidget(self.transcript, 1)
        right_layout.addWidget(self.status)
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


    # ---------------------------------------------------------------- the controller's state

    @property
    def model_name(self) -> str | None:
        return self.controller.model_name

    @property
    def conversation(self) -> Conversation | None:
        return self.controller.conversation

    @property
    def reply(self) -> Reply | None:
        """The answer being generated (the request's `Reply`)."""
        return self.controller.reply  # type: ignore[return-value]

    @property
    def first_token_seconds(self) -> float | None:
        return self.controller.first_token_seconds

    # ---------------------------------------------------------------- conversations

    def set_model(self, name: str | None) -> None:
        self.controller.set_model(name)

    def model_changed(self) -> None:
        self.backend.set_target(self.catalog, self.controller.model_name)

    def _catalog_changed(self, kinds: list[str], names: list[str]) -> None:
        """Which backends can serve the current model may have changed (a part was
        imported, converted or removed), or the model itself was removed or edited."""
        if self.model_name is None or not touches(kinds, ("model", "adapter", "variant")):
            return
        if not self.controller.model_exists():
            # Removed: nothing to chat with (the window selects another).
            self.set_model(None)
            return
        if self.reply is None:
            self.backend.set_target(self.catalog, self.model_name)
            self._render_header()

    def show_list(self) -> None:
        """The conversations the controller read last, as the search filters them."""
        # Not blockSignals: the list view must hear of the rows; a flag tells the
        # rename and pick handlers that this is a reload, not the user.
        self._listing = True
        try:
            self._fill_list()
        finally:
            self._listing = False
        if self.conversation is not None:
            self._select_in_list(self.conversation.id)
        self._update_buttons()  # a chat kept (or deleted) can be renamed (or not)

    def _fill_list(self) -> None:
        self.list_model.clear()
        if self.model_name is None:
            return
        query = self.search.text().strip()
        found = self.controller.matching(query)
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
        if conv_id and not self._listing:
            self.controller.rename(conv_id, item.text())

    def rename_chat(self, title: str | None = None) -> None:
        """Rename the current conversation: to `title`, or in place in the list."""
        if self.conversation is None:
            return
        if title is not None:
            self.controller.rename(self.conversation.id, title)
            return
        if not self.conversation.messages:
            self.controller.keep()  # an empty chat is listed once it is named
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
        return self.controller.export(path)

    def open_conversation(self, conversation: Conversation) -> None:
        self.controller.open(conversation)

    def conversation_opened(self) -> None:
        self.stop_editing()
        self._load_settings()
        if self.conversation is not None:
            self._select_in_list(self.conversation.id)

    def _pick_conversation(self, current: Any, _previous: Any) -> None:
        if not current.isValid() or self._listing:
            return
        conv_id = current.data(ConversationId)
        if conv_id:
            self.controller.pick(conv_id)

    def new_chat(self) -> None:
        if self.model_name is None:
            return
        self.controller.new_chat()
        self.input.setFocus()

    def delete_chat(self) -> None:
        self.controller.delete()

    def show_status(self, text: str) -> None:
        self.status.setText(text)

    # ---------------------------------------------------------------- chat settings

    def _toggle_settings(self, shown: bool) -> None:
        self.settings_box.setVisible(shown)
        self.settings_toggle.setArrowType(Qt.ArrowType.DownArrow if shown
                                          else Qt.ArrowType.RightArrow)

    def _load_settings(self) -> None:
        """Show the conversation's settings (the profile's where it has none)."""
        values = self.controller.settings()
        if values is None:
            return
        self._loading_settings = True
        self.system_prompt.setPlaceholderText(values.profile_system or "no system prompt")
        self.system_prompt.setPlainText(values.system)
        self.chat_temperature.setValue(values.temperature)
        self.chat_top_p.setValue(values.top_p)
        self.chat_max_tokens.setValue(values.max_tokens)
        self.chat_seed.setValue(values.seed)
        self._loading_settings = False
        self._show_custom()

    show_settings = _load_settings

    def _show_custom(self) -> None:
        self.settings_toggle.setText("Chat settings (custom)"
                                     if self.controller.custom_settings() else "Chat settings")
        count = len(self.controller.tools())
        self.tools_button.setText(f"Tools ({count})…" if count else "Tools…")

    def open_tools(self) -> ToolsDialog | None:
        """The Tools dialog of the conversation on show (not blocking: `open`)."""
        if self.conversation is None:
            return None
        self.tools_dialog = ToolsDialog(self.controller, self)
        self.tools_dialog.accepted.connect(self._show_custom)
        self.tools_dialog.open()
        return self.tools_dialog

    def _settings_edited(self) -> None:
        if self._loading_settings or self.conversation is None:
            return
        self.controller.edit_settings(self.system_prompt.toPlainText(),
                                      self.chat_temperature.value(), self.chat_top_p.value(),
                                      self.chat_max_tokens.value(), self.chat_seed.value())
        self._show_custom()

    def _reset_settings(self) -> None:
        self.controller.reset_settings()

    # ---------------------------------------------------------------- rendering

    def show_conversation(self) -> None:
        """The whole transcript, drawn again (the streaming answer's region with it)."""
        self._stream = self._region = None
        if self.model_name is None or self.conversation is None:
            self.header.setText("Choose a model or variant to chat with.")
            self.transcript.setHtml("")
            self._update_buttons()
            return
        self._render_header()
        messages = self.conversation.messages
        busy = self.reply is not None
        self._drawn_dark = self._dark()
        page = transcript_html(messages, busy, self._drawn_dark)
        self._code = page.code
        self.transcript.setHtml(page.html if messages or busy
                                else purpose_html(self.catalog, self.model_name))
        self._scroll_to_end()
        self._update_buttons()

    def _dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        # A theme switch: the transcript's code is highlighted for one theme, so it is
        # drawn again (an answer being streamed is drawn whole when it ends).
        drawn = getattr(self, "_drawn_dark", None)  # None: not drawn yet
        if (event.type() == QEvent.Type.PaletteChange and drawn is not None
                and drawn != self._dark() and self.reply is None):
            self.show_conversation()

    def _scroll_to_end(self) -> None:
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _render_header(self) -> None:
        if self.model_name is None:
            return
        text, servable = self.controller.header()
        self.header.setText(text)
        self.header.setStyleSheet("font-weight:bold" if servable
                                  else "font-weight:bold;color:#d23c3c")

    def _update_buttons(self) -> None:
        """Each button as the controller's rules say (`ChatController.actions`)."""
        can = self.controller.actions()
        self.send_button.setEnabled(can.send)
        self.stop_button.setEnabled(can.stop)
        self.regen_button.setEnabled(can.regenerate)
        self.copy_button.setEnabled(can.copy)
        self.input.setEnabled(can.compose)
        self.rename_button.setEnabled(can.rename)
        self.export_button.setEnabled(can.export)
        self.delete_button.setEnabled(can.delete)
        self.settings_box.setEnabled(can.settings)
        self.tools_button.setEnabled(can.tools)

    def stream_started(self) -> None:
        self._stream = streaming_markdown(self._dark())
        self._region = StreamRegion(self.transcript.document(),
                                    streaming_head_html(self.model_name))
        self._region.show(StreamFrame("", EMPTY_BODY))
        self._scroll_to_end()

    def stream_grew(self, text: str) -> None:
        if self._stream is None or self._region is None:
            return
        self._region.show(self._stream.feed(text))
        self._scroll_to_end()

    def busy_changed(self, busy: bool) -> None:
        self._update_buttons()
        self.busyChanged.emit(busy)

    def answer_finished(self) -> None:
        self.answered.emit()

    # ---------------------------------------------------------------- the user's actions

    def send(self) -> None:
        if self.controller.send(self.input.toPlainText()):
            self.input.clear()
            self.stop_editing()

    def edit_message(self, index: int) -> None:
        """Put user message `index` in the composer; sending it makes a branch."""
        if not self.controller.start_editing(index):
            return
        self.input.setPlainText(self.controller.message_text(index) or "")
        self.editing_label.setText(f"Editing message {index + 1}: Send makes a new branch "
                                   "(the old one is kept as a version).")
        self.editing_label.show()
        self.cancel_edit.show()
        self.input.setFocus()

    def reply_to_call(self, call_id: str) -> None:
        """Write the result of tool call `call_id` in the composer; Send adds it."""
        call = self.controller.start_tool_reply(call_id)
        if call is None:
            return
        self.input.clear()
        self.editing_label.setText(f"Result of {call.name} ({call.id}): Send adds it; the "
                                   "model goes on once every call has its result.")
        self.editing_label.show()
        self.cancel_edit.show()
        self.input.setFocus()

    def stop_editing(self) -> None:
        # Both, not `or`: each mode is left whichever one was on.
        edited, replied = self.controller.stop_editing(), self.controller.stop_tool_reply()
        if edited or replied:
            self.input.clear()
        self.editing_label.hide()
        self.cancel_edit.hide()

    def regenerate(self) -> None:
        self.controller.regenerate()

    def switch_version(self, index: int, step: int) -> None:
        self.controller.switch_version(index, step)

    def stop(self) -> None:
        self.controller.stop()

    def _abandon(self) -> None:
        self.controller.abandon()

    def _spec(self) -> SessionSpec:
        return self.controller.spec()

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
        elif scheme == "copymsg" and self.controller.message_text(number) is not None:
            QGuiApplication.clipboard().setText(self.controller.message_text(number) or "")
            self.status.setText("answer copied")
        elif scheme == "edit":
            self.edit_message(number)
        elif scheme in ("prev", "next"):
            self.switch_version(number, -1 if scheme == "prev" else 1)
        elif scheme == "regenerate":
            self.regenerate()
        elif scheme == "replay":
            self.replay_message(number)
        elif scheme == "toolresult":
            self.reply_to_call(rest)
        elif scheme in ("http", "https"):
            QDesktopServices.openUrl(url)

    def replay_message(self, index: int) -> None:
        """Regenerate answer `index` from its replay record; the verdict goes to the
        status line (and `replayed`)."""
        record = self.controller.replay_record(index)
        if record is None or self.replayer.running():
            return
        self.status.setText("replaying…")
        self.replayer.replay(record)

    def _replayed(self, found: dict) -> None:
        self.last_replay = found
        self.status.setText(verdict_text(found))
        self.status.setToolTip("\n".join(found.get("identity_changes") or []))
        self.replayed.emit(found)

    def copy_last(self) -> None:
        text = self.controller.last_answer_text()
        if text is not None:
            QGuiApplication.clipboard().setText(text)
