"""Child processes that speak JSON lines: the primitive under the worker service
(`engine.runtime.service`) and llama.cpp's quantizer child.

Parent side, `ChildProcess`: spawns `python -m MODULE` in its own session (a Ctrl-C in
the terminal reaches the parent, which cancels cleanly), writes messages to its stdin,
reads its protocol stream and its stderr on two reader threads (keeping the last log
lines), and reports the exit once the stream has ended.

Child side, `ChildChannel`: keeps a private copy of stdout for the protocol and points
fd 1 at stderr, so nothing a native library prints can corrupt the protocol; `send`
writes one message atomically from any thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.runtime import protocol

LOG_LINES = 200


class ChildChannel:
    """The child's end: call once at start, before anything native is loaded."""

    def __init__(self) -> None:
        self._out = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = memoryview(protocol.encode(message))
        with self._lock:
            while data:
                data = data[os.write(self._out, data):]


class ChildProcess:
    """The parent's end of one child process."""

    def __init__(self, module: str, env: dict[str, str],
                 on_message: Callable[[dict[str, Any]], None],
                 on_exit: Callable[[int], None], name: str = "child") -> None:
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self._on_message = on_message
        self._on_exit = on_exit
        self._write_lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, bufsize=0, start_new_session=True)
        self.pid = self.proc.pid
        threading.Thread(target=protocol.read_log, args=(self.proc.stderr, self.log),
                         daemon=True, name=f"{name}-log").start()
        threading.Thread(target=self._read, daemon=True, name=f"{name}-events").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        protocol.read_messages(self.proc.stdout, self._on_message)
        self._on_exit(self.proc.wait())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def write(self, message: dict[str, Any]) -> bool:
        """Send one message; False if the child is gone (its exit is reported anyway)."""
        assert self.proc.stdin is not None
        try:
            with self._write_lock:
                self.proc.stdin.write(protocol.encode(message))
                self.proc.stdin.flush()
        except (OSError, ValueError):  # a closed pipe, or stdin closed by `finish`
            return False
        return True

    def close_input(self) -> None:
        """Close the child's stdin: it stops reading and ends."""
        assert self.proc.stdin is not None
        with self._write_lock:
            try:
                self.proc.stdin.close()
            except OSError:  # a broken pipe: the child is gone already
                pass

    def finish(self, timeout: float) -> None:
        """Close the child's stdin (it stops reading and ends), wait, kill if it hangs."""
        try:
            self.close_input()
            self.proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()

    def tail(self, count: int) -> list[str]:
        return list(self.log)[-count:]


def describe_exit(code: int, what: str = "the engine process") -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{what} was killed by {name}"
    return f"{what} exited with code {code}"
