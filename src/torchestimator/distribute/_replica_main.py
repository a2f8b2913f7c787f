"""Runs a replica's program as ``python`` would, then ends the process without finalizing the interpreter.

``python -m torchestimator.distribute._replica_main script.py ARGS`` (or ``... -m package.module ARGS``) is the
command the replicas of a plain script (``launcher.start_local_replicas``) and the workers of ``torchestimator
launch`` run. Belongs here: running the program as ``__main__`` with the ``sys.argv`` and ``sys.path[0]`` that
``python`` gives it, Python's own handling of how it ended (the exit status of ``sys.exit(n)``, an uncaught
exception's traceback and status 1, Ctrl-C's SIGINT), what the interpreter does before it finalizes (join the
non-daemon threads, run the atexit handlers, flush), and the final ``os._exit``. Does not belong here: which
command starts a replica (``launcher.py``), process groups (the strategies'; their teardown is an atexit handler
and runs here).

Why: torch's C++ threads (gloo's workers above all) may still be letting go of a tensor when a program ends. A
thread that waits for the GIL once the main thread is in ``Py_FinalizeEx`` is ended by CPython with
``pthread_exit``, whose unwinding through torch's ``noexcept`` code calls ``std::terminate``: "terminate called
without an active exception", SIGABRT, after the program's work is done (tests/test_replica_output.py, about 1
run in 5). ``collectives.hand_over`` closes the paths torchestimator's own collectives open; torch's own
(torchmetrics' sync, DDP, FSDP) remain. Here no thread can meet finalization: there is none, ``os._exit`` ends
every thread at once, after everything that finalization would have done for the program's sake.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import NoReturn

REPLICA_MAIN = "torchestimator.distribute._replica_main"
"""This module's name, for ``python -m``."""

INTERRUPTED = -int(signal.SIGINT)
"""The status ``run_program`` returns for an uncaught KeyboardInterrupt: the process ends by SIGINT, as Python's
does (so a parent can tell Ctrl-C from a failure)."""

FLUSH_FAILED = 120
"""Python's exit status when flushing standard output fails at exit (e.g. a closed pipe)."""

_USAGE = "usage: python -m torchestimator.distribute._replica_main (script.py | -m module) [args ...]\n"


def main(argv: Sequence[str]) -> NoReturn:
    """Runs the program ``argv`` names, then ends this process with its status (never returns)."""
    end_process(run_program(argv))


def run_program(argv: Sequence[str]) -> int:
    """Runs ``script.py ARGS`` or ``-m module ARGS`` as ``__main__``; its exit status as Python reckons it.

    ``SystemExit`` gives its code (None: 0; an int: that, modulo 256; anything else is printed to standard error
    and gives 1); any other exception is printed through ``sys.excepthook`` from the program's first frame, as
    Python prints it, and gives 1 (``INTERRUPTED`` for KeyboardInterrupt).
    """
    argv = list(argv)
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write(_USAGE)
        return 2
    try:
        _run_as_main(argv)
    except SystemExit as request:
        return _exit_status(request.code)
    except BaseException as error:
        _print_uncaught(error)
        return INTERRUPTED if isinstance(error, KeyboardInterrupt) else 1
    return 0


def _run_as_main(argv: list[str]) -> None:
    if argv[0].startswith("-m"):
        module = argv[0][2:] or argv[1]
        arguments = argv[1:] if argv[0] != "-m" else argv[2:]
        # python -m's own entry: runs the module in __main__'s namespace and makes sys.argv[0] its file;
        # sys.path[0] is already the working directory, as under `python -m module`.
        sys.argv = [module, *arguments]
        runpy._run_module_as_main(module)  # type: ignore[attr-defined]
        return
    path = argv[0]
    sys.argv = list(argv)
    if not (sys.version_info >= (3, 11) and sys.flags.safe_path) and sys.path:
        # `python -m` put the working directory first; `python script.py` puts the script's folder (a folder or
        # zip archive run as a program: run_path puts it first itself).
        if os.path.isdir(path) or not os.path.isfile(path) or _is_zip(path):
            del sys.path[0]
        else:
            sys.path[0] = os.path.dirname(os.path.realpath(path))
    runpy.run_path(os.path.abspath(path), run_name="__main__")  # __file__ absolute, as Python makes it


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def _exit_status(code: object) -> int:
    """Python's exit status for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def _print_uncaught(error: BaseException) -> None:
    """Prints ``error`` as Python prints an uncaught exception: through ``sys.excepthook`` (which torch or the
    program may have replaced), starting at the program's own first frame, not at runpy's or this module's."""
    tb = error.__traceback__
    ours = (runpy.__dict__, globals())
    while tb is not None and tb.tb_next is not None and any(tb.tb_frame.f_globals is names for names in ours):
        tb = tb.tb_next
    error.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, tb
    try:
        sys.excepthook(type(error), error, tb)
    except BaseException:
        traceback.print_exception(type(error), error, tb)


def end_process(status: int) -> NoReturn:
    """Does what the interpreter does at exit before it finalizes, then ends every thread at once with ``status``.

    In Python's order: threading's exit callbacks and the non-daemon threads (``threading._shutdown``, what
    ``Py_FinalizeEx`` calls first), the atexit handlers (the program's and ours: the strategy's teardown destroys
    its process group, logging flushes its handlers), then standard output and error, and C's buffers.
    """
    _quietly("waiting for the program's threads", getattr(threading, "_shutdown", lambda: None))
    _quietly("running the atexit handlers", atexit._run_exitfuncs)
    if not _flushed():
        status = FLUSH_FAILED
    _flush_c_streams()
    if status == INTERRUPTED:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + int(signal.SIGINT)  # where SIGINT cannot end the process
    os._exit(status)


def _quietly(what: str, step: object) -> None:
    try:
        step()  # type: ignore[operator]
    except BaseException as error:
        try:
            sys.stderr.write(f"Exception ignored while {what} at exit:\n")
            traceback.print_exception(type(error), error, error.__traceback__)
        except Exception:
            pass


def _flushed() -> bool:
    """Flushes standard output and error, as the interpreter does at exit; False when standard output could not
    take it (the interpreter then says so and exits with 120)."""
    ok = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception as error:
            ok = False
            if name == "stdout":
                _quietly("flushing standard output", lambda error=error: _say_unflushed(error))
    return ok


def _say_unflushed(error: Exception) -> None:
    sys.stderr.write(f"Exception ignored in: {sys.stdout!r}\n{type(error).__name__}: {error}\n")
    sys.stderr.flush()


def _flush_c_streams() -> None:
    """C's ``stdout`` buffers what C++ code printed; ``exit`` would flush it, ``os._exit`` does not."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (ImportError, OSError, AttributeError):
        pass


if __name__ == "__main__":
    # Imported under its own name: the program runs in __main__'s namespace and may rebind any name in it.
    from torchestimator.distribute._replica_main import main as _main

    _main(sys.argv[1:])
