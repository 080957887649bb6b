"""The one worker service: requests to a child process, each ending exactly once.

Every child process of the engine (the engine host, the merge worker, the training
worker) speaks the same request lifecycle over `runtime.worker`'s JSON-lines channel:

- in: `{"id", "op", "params"}` per request, `{"op": "cancel", "target": id}`,
  `{"op": "shutdown"}`; closing stdin cancels everything in flight (the parent went
  away);
- out: events of a request (`{"id", "event", ...}`: tokens, progress, a training run's
  stages) and then exactly one terminal event: `finished` (with `result`), `failed`
  (with `error`) or `cancelled`.

Parent side, `ServiceClient`: starts the child on demand, gives every request an id
and a `RequestHandle`, decodes its events (typed: `engine.runtime.messages`), and
guarantees each request ends exactly once; a failure after a cancel reads as a cancel,
and if the child dies every request in flight fails with "<what> stopped: <why>" and
the last lines of its log (the next request starts a fresh child).

Child side, `Inbox` and `Job`: the main thread reads requests (so a cancel takes effect
during long work) and hands each over as a `Job`, which writes its events and ends
exactly once (`finish` / `fail`). `serve` is the whole child loop for workers that run
one request at a time (merge, training); the engine host schedules its jobs itself.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import wire
from engine.errors import Cancelled, EngineError, StudioError
from engine.runtime import messages as m
from engine.runtime import protocol
from engine.runtime.worker import ChildChannel, ChildProcess, describe_exit

EventCallback = Callable[[Any], None]
StateCallback = Callable[[str, str], None]
EnvFactory = Callable[[], dict[str, str]]
# Reads one wire message of a request as its typed event (None: one to ignore); given
# the request's type, so a `finished` result is read as that request's result type.
Decoder = Callable[[dict[str, Any], Any], Any]


# --------------------------------------------------------------------------- parent side


@dataclass
class RequestHandle:
    id: str
    op: str
    on_event: EventCallback | None
    kind: Any = None  # the request's type: reads its result (None: the raw JSON)
    done: threading.Event = field(default_factory=threading.Event)
    outcome: str | None = None  # finished | failed | cancelled
    result: Any = None
    error: StudioError | None = None
    cancel_requested: bool = False
    process: int = 0  # which child (ServiceClient.starts) it was sent to

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the request ends; return its result or raise its error."""
        if not self.done.wait(timeout):
            raise EngineError(f"request {self.op} timed out after {timeout} s")
        if self.outcome == "finished":
            return self.result
        if self.outcome == "cancelled":
            raise Cancelled(f"{self.op} cancelled")
        assert self.error is not None
        raise self.error


class ServiceClient:
    """The parent's end of one kind of worker process (see the module docstring).

    `what` names the child in messages ("the engine process"), `stopped` begins the
    error of requests a dead child leaves behind ("engine" → "engine stopped: ...").
    `env` is the child's environment, or a function called at each start that returns
    it (so a restarted child sees settings changed since the last one). With
    `quiet_after_cancel`, a cancelled request delivers nothing but its terminal event
    (a chat stops showing tokens at once); without, events the child still sends on
    its way out (a training run's checkpoint) are delivered too.
    """

    def __init__(self, module: str, *, what: str, stopped: str,
                 env: dict[str, str] | EnvFactory | None = None,
                 on_state: StateCallback | None = None, decode: Decoder = m.decode_event,
                 quiet_after_cancel: bool = True) -> None:
        self._module = module
        self._what = what
        self._stopped = stopped
        self._env = env
        self._on_state = on_state
        self._decode = decode
        self._quiet_after_cancel = quiet_after_cancel
        self._lock = threading.RLock()
        self._child: ChildProcess | None = None
        self._pending: dict[str, RequestHandle] = {}
        self._ids = itertools.count(1)
        self.state = "stopped"
        self.pid: int | None = None
        self.starts = 0
        self._killed: ChildProcess | None = None  # a kill we asked for
        self._last: ChildProcess | None = None  # its log outlives it, for reports

    # ---------------------------------------------------------------- process

    def _set_state(self, state: str, detail: str = "") -> None:
        self.state = state
        if self._on_state:
            self._on_state(state, detail)

    def running(self) -> bool:
        """Whether the child is alive now (nothing is started to find out)."""
        with self._lock:
            return self._child is not None and self._child.alive()

    def _ensure_started(self) -> ChildProcess:
        if self._child is not None and self._child.alive():
            return self._child
        if callable(self._env):
            env = dict(self._env())
        else:
            env = dict(os.environ if self._env is None else self._env)
        self.starts += 1
        number = self.starts
        holder: list[ChildProcess] = []
        child = ChildProcess(self._module, env, self._dispatch,
                             lambda code: self._on_exit(holder[0], code, number),
                             self._stopped.replace(" ", "-"))
        holder.append(child)
        self._child = self._last = child
        self.pid = child.pid
        self._set_state("running", f"pid {child.pid}")
        return child

    def _dispatch(self, message: dict[str, Any]) -> None:
        with self._lock:
            handle = self._pending.get(str(message.get("id")))
        if handle is None:
            return
        try:
            event = self._decode(message, handle.kind)
        except StudioError as exc:  # a child of another version, or a bug
            if message.get("event") != "finished":
                return
            event = m.Failed(EngineError(f"{self._what} answered {handle.op} with a "
                                         f"malformed result: {exc.message}"))
        if event is None:
            return
        if isinstance(event, m.TERMINAL):
            with self._lock:
                self._pending.pop(handle.id, None)
            if isinstance(event, m.Finished):
                handle.result = event.result
                handle.outcome = "finished"
            elif handle.cancel_requested or isinstance(event, m.Cancelled):
                event = m.Cancelled()
                handle.outcome = "cancelled"
            else:
                handle.error = event.error
                handle.outcome = "failed"
            self._deliver(handle, event)
            handle.done.set()
            return
        if handle.cancel_requested and self._quiet_after_cancel:
            return
        self._deliver(handle, event)

    @staticmethod
    def _deliver(handle: RequestHandle, event: Any) -> None:
        if handle.on_event is not None:
            try:
                handle.on_event(event)
            except Exception:  # a failing callback must not kill the reader
                traceback.print_exc()

    def _on_exit(self, child: ChildProcess, code: int, number: int) -> None:
        with self._lock:
            if self._child is child:
                self._child = None
            superseded = self._child is not None  # a fresh child already runs
            # Only this process's requests: a fresh child's are still being served.
            failed = [h for h in self._pending.values() if h.process == number]
            for handle in failed:
                del self._pending[handle.id]
        restarted = child is self._killed  # kill(expected=True): a restart, not a crash
        reason = describe_exit(code, self._what)
        tail = child.tail(8)
        for handle in failed:
            if handle.cancel_requested:
                handle.outcome = "cancelled"  # it was asked to stop, and it did
                self._deliver(handle, m.Cancelled())
            else:
                handle.outcome = "failed"
                handle.error = EngineError(f"{self._stopped} stopped: {reason}",
                                           details=tuple(tail))
                self._deliver(handle, m.Failed(handle.error))
            handle.done.set()
        if superseded:
            return  # the new child's "running" is the state; this exit is history
        if restarted or (code == 0 and not failed):
            self._set_state("stopped", "restarted" if restarted else "")
        else:
            detail = f"{self._stopped} stopped: {reason}"
            if tail:
                detail += " — last log: " + " | ".join(tail[-3:])
            self._set_state("crashed", detail)

    # ---------------------------------------------------------------- requests

    def submit(self, request: m.Request, on_event: EventCallback | None = None
               ) -> RequestHandle:
        """Send a typed request; its events go to `on_event` (on the reader thread)."""
        return self.submit_raw(request.OP, request.to_params(), on_event, type(request))

    def submit_raw(self, op: str, params: Any, on_event: EventCallback | None = None,
                   kind: Any = None) -> RequestHandle:
        """Send a request as wire data (tests of what a child refuses send it so;
        without `kind` its result stays the raw JSON)."""
        with self._lock:
            child = self._ensure_started()
            handle = RequestHandle(f"r{next(self._ids)}", op, on_event, kind,
                                   process=self.starts)
            self._pending[handle.id] = handle
            # A failed write: the reader sees the exit and fails this request.
            child.write({"id": handle.id, "op": op, "params": params})
        return handle

    def call(self, request: m.Request, timeout: float | None = None) -> Any:
        return self.submit(request).wait(timeout)

    def cancel(self, handle: RequestHandle) -> None:
        """Ask the child to stop `handle`; it ends with `cancelled` (see the class
        docstring for what is delivered before that)."""
        with self._lock:
            if handle.done.is_set() or handle.id not in self._pending:
                return
            handle.cancel_requested = True
            if self._child is not None:
                self._child.write({"op": "cancel", "target": handle.id})

    def log_tail(self, count: int = 20) -> list[str]:
        with self._lock:
            child = self._last
        return child.tail(count) if child is not None else []

    def kill(self, expected: bool = False) -> None:
        """Kill the child. Requests in flight fail with "<stopped> stopped: ...".

        `expected` (a restart the user asked for) reports the exit as "stopped"
        rather than "crashed"; a plain kill is what a crash looks like to the client.
        """
        with self._lock:
            child = self._child
            if child is not None and expected:
                self._killed = child
        if child is not None:
            child.kill()

    def release(self) -> None:
        """Let the child go once it is done: it ends by itself (nothing waits here)."""
        with self._lock:
            child = self._child
        if child is not None:
            child.write({"op": "shutdown"})
            child.close_input()

    def close(self, timeout: float = 10.0) -> None:
        """Ask the child to stop after its current request, wait, kill it if it hangs."""
        with self._lock:
            child = self._child
        if child is None:
            return
        child.write({"op": "shutdown"})
        child.finish(timeout)


# --------------------------------------------------------------------------- child side


class Job:
    """One request in the child: its events, its cancel flag, and its one ending."""

    def __init__(self, channel: ChildChannel, ident: str, op: str, params: Any,
                 on_end: Callable[[Job], None] = lambda job: None) -> None:
        self.id = ident
        self.op = op
        self.params = params
        self.cancel = threading.Event()
        self._channel = channel
        self._on_end = on_end
        self._ended = False
        self._lock = threading.Lock()

    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def emit(self, event: str, **payload: Any) -> None:
        self._channel.send({"id": self.id, "event": event, **payload})

    def progress(self, stage: str, fraction: float) -> None:
        self.emit("progress", stage=stage, fraction=fraction)

    def finish(self, result: Any) -> None:
        self._end({"event": "finished", "result": wire.encode(result)})

    def fail(self, exc: BaseException) -> None:
        """End with `exc`: `cancelled` if it is a cancel (or one was asked for), else
        `failed` with the error (and the traceback, for an error that is not ours)."""
        if isinstance(exc, Cancelled) or self.cancelled():
            self._end({"event": "cancelled"})
            return
        payload = protocol.error_payload(exc)
        if not isinstance(exc, StudioError):
            payload["details"] = payload["details"] + traceback.format_exception(exc)
        self._end({"event": "failed", "error": payload})

    def run(self, work: Callable[[], Any]) -> None:
        """`work()`'s result or error as this job's ending."""
        try:
            if self.cancelled():
                raise Cancelled("cancelled before it started")
            result = work()
        except Exception as exc:
            self.fail(exc)
        else:
            self.finish(result)

    def _end(self, message: dict[str, Any]) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._channel.send({"id": self.id, **message})
        self._on_end(self)


class Inbox:
    """The child's requests, read on the calling thread (see `read`)."""

    def __init__(self, channel: ChildChannel) -> None:
        self.channel = channel
        self._pending: dict[str, Job] = {}
        self._lock = threading.Lock()

    def read(self, deliver: Callable[[Job], None]) -> None:
        """Hand each request over as a `Job`, and set the cancel flags asked for, until
        stdin closes or a shutdown arrives; then cancel everything still in flight."""
        for line in sys.stdin.buffer:
            if len(line) > protocol.MAX_LINE:
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(message, dict):
                continue
            op = message.get("op")
            if op == "shutdown":
                break
            if op == "cancel":
                with self._lock:
                    target = self._pending.get(str(message.get("target")))
                if target is not None:
                    target.cancel.set()
                continue
            job = Job(self.channel, str(message.get("id")), str(op),
                      message.get("params") or {}, self._forget)
            with self._lock:
                self._pending[job.id] = job
            deliver(job)
        with self._lock:
            for job in self._pending.values():
                job.cancel.set()

    def _forget(self, job: Job) -> None:
        with self._lock:
            self._pending.pop(job.id, None)


def serve(channel: ChildChannel, handle: Callable[[Job], Any], name: str,
          ready: dict[str, Any] | None = None) -> None:
    """A worker's whole life: requests run one at a time, in arrival order, on a thread
    named `name` (`handle(job)` returns the result or raises); the main thread reads.
    Returns once stdin has closed and the current request has ended (30 s at most)."""
    jobs: queue.Queue[Job | None] = queue.Queue()

    def work() -> None:
        while (job := jobs.get()) is not None:
            job.run(lambda job=job: handle(job))

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    channel.send({"event": "ready", "pid": os.getpid(), **(ready or {})})
    Inbox(channel).read(jobs.put)
    jobs.put(None)
    worker.join(timeout=30)
