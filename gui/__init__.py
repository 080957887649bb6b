"""Variant Studio's desktop app (PySide6). Talks to the engine only through
`gui.engine_client`; never imports a native runtime."""
