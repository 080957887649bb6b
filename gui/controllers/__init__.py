"""The window's long-running flows, out of the main window: each controller owns one
flow's state and background work and reports through Qt signals, so the window only
wires views to controllers.

- `library_check.LibraryCheck`: checks, off the GUI thread, the library entries whose
  files are new or changed on disk (they are badged "unchecked" until then).
- `openvino_build.OpenVinoBuild`: builds the curated OpenVINO default through the
  engine process (a qasync coroutine awaiting the engine's reply, then the
  registration on a worker thread).
- `training.TrainingController`: starts, relays and cancels training runs for the
  Train page and announces what a finished run added.

Every catalog change a controller makes is announced through the window's
`CatalogEvents`.
"""
