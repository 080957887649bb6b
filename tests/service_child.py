"""A worker of the worker service for tests/test_worker_service.py: `python -m
tests.service_child`. Requests: "echo" (finishes with its params), "wait" (progress
until cancelled), "refuse" (a RefusedError), "bug" (a ValueError), "exit" (the process
exits with code 3 mid-request)."""

from __future__ import annotations

import os
from typing import Any

from engine.errors import Cancelled, RefusedError
from engine.runtime import service
from engine.runtime.worker import ChildChannel


def handle(job: service.Job) -> Any:
    if job.op == "echo":
        return job.params
    if job.op == "wait":
        job.progress("waiting", 0.5)
        job.cancel.wait(60)  # returns at once when cancelled
        job.emit("late")  # a child may still say something on its way out
        if job.cancelled():
            raise Cancelled("stopped waiting")
        return "not cancelled"
    if job.op == "refuse":
        raise RefusedError("refused on purpose")
    if job.op == "bug":
        raise ValueError("a bug")
    if job.op == "exit":
        job.progress("exiting", 0.1)
        os._exit(3)  # the progress line is already written: send is synchronous
    raise RefusedError(f"unknown op {job.op!r}")


if __name__ == "__main__":
    service.serve(ChildChannel(), handle, "test-worker")
