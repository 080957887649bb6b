"""The window's long-running flows, out of the main window: each controller owns one
flow's state and background work and reports through Qt signals (or, for the chat and
the comparison, to a listener), so the window only wires views to controllers.

- `library_check.LibraryCheck`: checks, off the GUI thread, the library entries whose
  files are new or changed on disk (they are badged "unchecked" until then).
- `openvino_build.OpenVinoBuild`: builds the curated OpenVINO default through the
  engine process (a qasync coroutine awaiting the engine's reply, then the
  registration on a worker thread).
- `training.TrainingController`: starts, relays and cancels training runs for the
  Train page and announces what a finished run added.
- `chat.ChatController`, `compare.CompareController`: the chat's and the comparison's
  state and rules (conversations, branches and versions, requests built by
  `engine.runtime.assembly`, results recorded and kept), plain Python with no Qt: they
  start requests through `engine_port.Engine` and tell their view what changed through
  a listener, so their tests need neither an engine nor a widget.

Every catalog change a controller makes is announced through the window's
`CatalogEvents`.
"""
