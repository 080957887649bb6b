"""How many threads the engine decodes on, and whether the machine is slowing it.

The one owner of the engine's default thread count. llama.cpp synchronises its
threads after every graph node (in this build an OpenMP barrier, `GOMP_barrier`), so
when another program holds one of the cores, a thread that finished its share waits
for one that is not running, hundreds of times per token: on a 2-core machine with one
core busy, two threads decoded at 0.03 of one thread's speed, while on a quiet machine
they are about 1.15x one thread (benchmarks/bench_contention.py, docs/performance.md).
No wait setting saves two threads there (no spinning at all gave 0.4 of one thread,
and lost more than half the quiet speed), so the answer is the thread count, chosen
while decoding:

- With threads on automatic (no `VARIANT_STUDIO_THREADS`, Settings' threads 0), the
  engine decodes on one thread per core while the other programs leave the cores
  free, and on as many as they leave free (at least one) while they do not.
  `Governor` measures that every fifth of a second (INTERVAL) from what the whole
  machine and this process used in that time (`/proc/stat` against `os.times()`),
  with hysteresis.
  Changing the thread count between two decodes does not change any result: llama.cpp
  computes each output row on one thread whatever their count (checked bit for bit;
  tests/test_contention.py).
- A thread count the user set is kept as it is; the governor then only reports.

Either way `machine_load()` tells the front ends (a result's `machine_load`, shown in
the window's status bar) when other programs were slowing the engine. Only the engine
process turns this on (`enable`, from the host); other users of the llama backend (the
training worker's checks) decode on the threads they ask for.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.runtime.results import MachineLoad

# Seconds between two measurements while decoding: at a 100 Hz tick counter a tick is
# 0.05 of a core here, fine enough for the half-core threshold, and a decode that
# collapsed is caught within a fifth of a second.
INTERVAL = 0.2
# A figure older than this says nothing of the answer just made (`Governor.load`).
STALE = 2.0
# Cores used by others above which the engine gives up a thread (more than half a
# core: one busy program), and below which it takes it back.
DOWN = 0.5
UP = 0.25


def configured() -> tuple[int, bool]:
    """The engine's threads and whether they are automatic: VARIANT_STUDIO_THREADS
    (set by the front end from the settings) when it is a positive number, else one
    per CPU core, adapted to what other programs leave free."""
    try:
        threads = int(os.environ.get("VARIANT_STUDIO_THREADS", "0"))
    except ValueError:
        threads = 0
    if threads > 0:
        return threads, False
    return cpu_count(), True


def cpu_count() -> int:
    """The cores this process may run on (its affinity, where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of CPU used so far: by the whole machine (all cores) and by us."""

    machine: float
    ours: float


def read_cpu_times() -> CpuTimes | None:
    """Busy time of the machine from /proc/stat (Linux) and this process's own;
    None where the machine's figure is not available."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(value) for value in fields[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user):
    # everything but idle and iowait is busy; steal is another VM holding the core.
    busy = sum(ticks[:8]) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    own = os.times()
    return CpuTimes(busy / os.sysconf("SC_CLK_TCK"), own.user + own.system)


class Governor:
    """Measures other programs' CPU use while the engine decodes, and picks the thread
    count for the next decode (only when `adaptive`)."""

    def __init__(self, max_threads: int, adaptive: bool, cpus: int | None = None,
                 sample: Callable[[], CpuTimes | None] = read_cpu_times,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_threads = max(1, max_threads)
        self.adaptive = adaptive
        self.cpus = cpus or cpu_count()
        self._sample = sample
        self._clock = clock
        self.current = self.max_threads
        self.others: float | None = None  # cores used by others in the last window
        self._last: tuple[float, CpuTimes] | None = None
        self._due = -math.inf  # when to measure next (once per INTERVAL at most)

    def threads(self) -> int:
        """The threads for the decode about to run (measuring first, when due: at most
        once per INTERVAL, also where the machine's figure cannot be read)."""
        now = self._clock()
        if now >= self._due:
            self._due = now + INTERVAL
            self._measure(now)
        return self.current if self.adaptive else self.max_threads

    def _measure(self, now: float) -> None:
        times = self._sample()
        if times is None:
            return
        last, self._last = self._last, (now, times)
        if last is None:
            return
        # After an idle spell the window is that whole spell: what others used while
        # the engine waited is the best guess for the first decode of a request (a
        # collapsed start would cost more than a cautious one), and the next window,
        # INTERVAL later, corrects it.
        elapsed = now - last[0]
        used = (times.machine - last[1].machine) - (times.ours - last[1].ours)
        self.others = max(0.0, used / elapsed)
        self.current = self.choose(self.others)

    def choose(self, others: float) -> int:
        """Threads for the cores others leave free: fewer once they use more than
        DOWN of a core beyond what we would leave, more again only under UP."""
        down = math.floor(self.cpus - others + DOWN)
        up = math.floor(self.cpus - others + UP)
        target = down if down < self.current else max(self.current, up)
        return min(self.max_threads, max(1, target))

    def load(self) -> MachineLoad | None:
        """What slowed the engine in the last window, or None when nothing did: others
        used more than DOWN of a core that the engine's threads would have used."""
        if self._last is not None and self._clock() - self._last[0] > STALE:
            return None  # measured long ago: not a figure for the answer just made
        others = self.others
        if others is None or others <= DOWN or others + self.max_threads <= self.cpus:
            return None
        return MachineLoad(round(others, 2), self.current if self.adaptive
                           else self.max_threads, self.max_threads, self.cpus)


_governor: Governor | None = None


def enable(max_threads: int, adaptive: bool) -> Governor:
    """Turn the measurement on for this process (the engine host does)."""
    global _governor
    _governor = Governor(max_threads, adaptive)
    return _governor


def threads_for(requested: int) -> int:
    """The threads a decode asked to run on `requested` should use now."""
    if _governor is None:
        return requested
    return max(1, min(requested, _governor.threads()))


def machine_load() -> MachineLoad | None:
    """What slowed the engine lately (None: nothing, or not measured here)."""
    return _governor.load() if _governor is not None else None
