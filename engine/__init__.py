"""Variant Studio engine: everything below the window, with no Qt.

Artifacts, catalog, identity, validation, the native backends, sessions, the engine
host process and the CLI live here. This package must import without Qt installed.
"""

__version__ = "0.1.0"
