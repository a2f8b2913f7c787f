"""The process's long-lived helper threads of the checkpoint code, one per job, kept between saves.

Starting a thread per file or per save cost ~3 ms each on a loaded machine; one long-lived thread per job
costs nothing after the first use. Each runs its tasks one at a time, in the order given.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["process_thread", "run_behind"]

_Result = TypeVar("_Result")

_threads: dict[str, tuple[int, ThreadPoolExecutor]] = {}
_threads_lock = threading.Lock()


def process_thread(job: str) -> ThreadPoolExecutor:
    """The process's one thread for ``job`` (named ``checkpoint-<job>``). A child made by fork (a DataLoader
    worker) gets its own: the parent's thread does not exist there."""
    with _threads_lock:
        owner, executor = _threads.get(job, (None, None))
        if owner != os.getpid() or executor is None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"checkpoint-{job}")
            _threads[job] = (os.getpid(), executor)
        return executor


def run_behind(job: str, action: Callable[..., _Result], *arguments: Any) -> Future[_Result]:
    """``action(*arguments)`` on the ``job`` thread; run here and now once the interpreter is shutting down (a
    save from an atexit handler: thread pools take no new work then), its outcome in the future alike."""
    try:
        return process_thread(job).submit(action, *arguments)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
        done: Future[_Result] = Future()
        try:
            done.set_result(action(*arguments))
        except BaseException as error:  # the caller's result() raises it, as from the thread
            done.set_exception(error)
        return done
