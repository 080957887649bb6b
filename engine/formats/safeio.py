"""Opening untrusted files safely.

A path given by a user may be a directory, a FIFO (opening it would block forever), a
device (reading it never ends), a symlink loop, a kernel pseudo-file in /proc or /sys
(it claims size 0 yet has content, and some, like /proc/kmsg, block when read), or a
file that another process is changing. `open_regular` refuses all of those with a
clear reason, and only ever returns a handle to a regular file whose size is known up
front.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from engine.errors import InspectionError


@dataclass(frozen=True)
class FileStat:
    size: int
    mtime_ns: int
    inode: int
    device: int


def describe_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@functools.cache
def _pseudo_devices() -> frozenset[int]:
    """Device numbers of the kernel's pseudo file systems (procfs, sysfs)."""
    found = set()
    for root in ("/proc", "/sys"):
        try:
            found.add(os.stat(root).st_dev)
        except OSError:
            pass
    return frozenset(found)


def _check_regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InspectionError(f"{path}: {describe_kind(st.st_mode)}, expected a regular file")
    if st.st_dev in _pseudo_devices():
        raise InspectionError(f"{path}: a kernel pseudo-file (/proc or /sys), "
                              "expected a regular file")


def stat_regular(path: Path) -> FileStat:
    """Stat `path` (following symlinks) and insist on a regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InspectionError(_os_reason(path, exc)) from exc
    _check_regular(path, st)
    return FileStat(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def open_regular(path: Path) -> tuple[BinaryIO, FileStat]:
    """Open a regular file for reading, refusing FIFOs, devices and symlink loops."""
    before = stat_regular(path)
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, open must not hang.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InspectionError(_os_reason(path, exc)) from exc
    try:
        st = os.fstat(fd)
        if st.st_ino != before.inode or st.st_dev != before.device:
            raise InspectionError(f"{path}: changed while it was being opened")
        _check_regular(path, st)
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return handle, FileStat(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _os_reason(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"{path}: symlink loop"
    if exc.errno == errno.ENOENT:
        return f"{path}: no such file"
    if exc.errno == errno.EACCES:
        return f"{path}: permission denied"
    return f"{path}: {exc.strerror or exc}"


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str, limit: int = 200) -> str:
    """Make untrusted text safe to show: no control characters, bounded length.

    Characters that are not printable (controls, escapes, bidi overrides, unassigned
    code points) are shown as Python escapes: \\x1b, \\u202e, \\U000e0001.
    """
    cleaned = "".join(ch if ch.isprintable() else _escape(ch) for ch in text[:limit])
    return cleaned + ("…" if len(text) > limit else "")
