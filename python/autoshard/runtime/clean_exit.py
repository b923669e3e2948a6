"""Clean process exits on gloo: the interpreter does not start shutting down while one of
gloo's worker threads still has to take the GIL.

Why this is needed (core dumps of runs that aborted with "terminate called without an
active exception" after every rank had written its results):
- gloo runs each collective on one of its process group's worker threads
  (``pt_gloo_runloop``). After the collective completes, and so after the caller's wait
  has returned, that thread drops its reference to the work, which holds the input and
  output tensors.
- When Python freed such a tensor's object while the work still held the tensor, torch
  hands the Python object to the tensor. Dropping the work then frees a Python object, so
  the worker thread takes the GIL.
- Once the interpreter is finalizing, a thread that takes the GIL is ended by
  ``pthread_exit``. Its unwinding passes through a ``noexcept`` destructor
  (``~AsyncWork``), and that calls ``std::terminate``: the rank aborts with exit -6.
- ``destroy_process_group`` does not join these threads: DeviceMesh objects and DTensor's
  sharding caches keep the process group alive until the interpreter ends.

So the window is a collective that completed a few milliseconds before the script
returned, with the worker thread not scheduled before the interpreter began to finalize.
On a busy 2-core machine it aborted 3 of 60 runs of a 2-rank test. The hook below runs at
exit, before finalization begins. It sleeps in short slices, which releases the GIL, until
no gloo worker thread has been runnable over three checks in a row, for at most
``_MAX_WAIT_S``. A worker waiting for the GIL gets it during the first slice and is
runnable until it is done.

Linux only (it reads the threads' states from /proc); elsewhere it waits one fixed slice.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

_WORKER_THREAD_NAME = "pt_gloo_runloop"  # the name torch gives gloo's worker threads
_SLICE_S = 0.002  # each check follows a sleep this long (the GIL released)
_QUIET_CHECKS = 3  # consecutive checks with no gloo worker runnable
_MAX_WAIT_S = 2.0  # a worker still busy then (a collective never waited for) is left
_FALLBACK_WAIT_S = 0.05  # no /proc: one sleep, which lets waiting workers take the GIL

_registered = False
_lock = threading.Lock()


def guard_process_exit() -> None:
    """Registers the exit hook once per process (idempotent, thread-safe)."""
    global _registered
    with _lock:
        if not _registered:
            atexit.register(wait_at_exit)
            _registered = True


def wait_at_exit() -> None:
    """The exit hook: the wait, and a line on stderr when it ran out (the abort may follow,
    and its message alone would not say why)."""
    if not wait_for_gloo_workers():
        sys.stderr.write(
            f"autoshard: gloo worker threads were still busy {_MAX_WAIT_S:g} s after the "
            "script ended (a collective issued and never waited for?); the process may "
            "abort at exit with 'terminate called without an active exception'\n"
        )


def wait_for_gloo_workers() -> bool:
    """Waits until no gloo worker thread of this process is runnable; True when that was
    seen within ``_MAX_WAIT_S`` (or there are none), False when the wait ran out."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        time.sleep(_FALLBACK_WAIT_S)
        return True
    if not _gloo_worker_states(tasks):
        return True  # no gloo process group in this process
    deadline = time.monotonic() + _MAX_WAIT_S
    quiet = 0
    while time.monotonic() < deadline:
        time.sleep(_SLICE_S)
        busy = any(state == "R" for state in _gloo_worker_states(tasks))
        quiet = 0 if busy else quiet + 1
        if quiet >= _QUIET_CHECKS:
            return True
    return False


def _gloo_worker_states(tasks: str) -> list[str]:
    """The scheduler state letter (R runnable, S sleeping, ...) of each gloo worker thread."""
    states = []
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/comm") as f:
                if f.read().strip() != _WORKER_THREAD_NAME:
                    continue
            with open(f"{tasks}/{tid}/stat") as f:
                # "pid (comm) state ...": comm may hold spaces or parentheses
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):  # the thread ended between listing and reading
            continue
    return states
