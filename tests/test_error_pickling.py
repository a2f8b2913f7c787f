"""Errors raised in a worker process reach the parent as themselves.

A spawn ProcessPoolExecutor pickles what the worker raised; an error that could not be rebuilt there
(MissingExtraError's required keywords, DiskFullError's cause) broke the pool (BrokenProcessPool)
instead. The classes' own round trips are tests/test_errors.py's; this is the boundary itself.
Kept light at import: each worker imports this module to find its function.
"""

from __future__ import annotations

import concurrent.futures
import errno
import multiprocessing

import pytest

from torchestimator.errors import DiskFullError, MissingExtraError

RESULT_TIMEOUT_S = 120  # a spawn worker imports Python and this module; generous for a loaded 2-core machine


def raise_disk_full(path: str) -> None:
    raise DiskFullError(
        OSError(errno.ENOSPC, "No space left on device"),
        path=path,
        what="a checkpoint",
        bytes_needed=4096,
        free_bytes=10,
        advice="Free some space in model_dir.",
    )


def raise_missing_extra(module: str) -> None:
    raise MissingExtraError(
        "the model server needs aiohttp: pip install 'torchestimator[serving]'", module=module, extra="serving"
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_errors_raised_in_a_spawn_worker_come_back_as_the_same_error():
    executor = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    futures = [executor.submit(raise_disk_full, "/m/ckpt-3"), executor.submit(raise_missing_extra, "aiohttp.web")]
    try:
        disk_full, missing = (future.exception(timeout=RESULT_TIMEOUT_S) for future in futures)
    finally:
        if not all(future.done() for future in futures):  # a hung worker must not hang shutdown too
            for process in list((executor._processes or {}).values()):
                process.kill()
        executor.shutdown(wait=True, cancel_futures=True)

    assert type(disk_full) is DiskFullError, repr(disk_full)  # not BrokenProcessPool
    assert (disk_full.errno, disk_full.filename, disk_full.bytes_needed) == (errno.ENOSPC, "/m/ckpt-3", 4096)
    assert str(disk_full) == (
        "[Errno 28] disk full: could not write a checkpoint to /m/ckpt-3 (No space left on "
        "device); it needs 4,096 bytes, 10 are free there. Free some space in model_dir."
    )
    assert type(missing) is MissingExtraError, repr(missing)
    assert (missing.module, missing.extra, missing.name) == ("aiohttp.web", "serving", "aiohttp.web")
    assert str(missing) == "the model server needs aiohttp: pip install 'torchestimator[serving]'"
    assert "raise_missing_extra" in str(missing.__cause__)  # the worker's traceback came along
