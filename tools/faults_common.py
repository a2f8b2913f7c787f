"""What the fault tools and fixture makers share: reading under a memory cap, protobuf varints and LevelDB-style
table blocks (a TF checkpoint's .index) for crafting files.

A reader that allocates what a crafted length declares should fail here with
MemoryError instead of taking the machine, so the fault tools and tests run
their readers in a process whose address space is capped at what it maps
already plus some headroom.
"""

from __future__ import annotations

import resource
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# formats.md 3.3's worked TF checkpoint .index: SaveV2(prefix, ["x", "s"], ["", ""], [float32 [1, 2], string
# ["ab", ""]]); its first 57 bytes are the data block.
WORKED_INDEX = bytes.fromhex(
    "00000608011a020801000111730807120412020802200828083591 88b04d".replace(" ", "")
    + "00010f7808011204120208022808355 93ce535".replace(" ", "")
    + "00000000"
    "01000000"
    "00"
    "d5d43377"
    "0000000001000000"
    "00c0f2a1b0"
    "000102"
    "79"
    "0039"
    "00000000"
    "01000000"
    "00704c70b5"
    "3e084b0e" + "00" * 36 + "57fb808b247547db"
)


def limit_memory(headroom_mb: int) -> None:
    """Cap this process's address space at what it maps now plus ``headroom_mb``."""
    with open("/proc/self/status") as status:
        mapped_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    limit = mapped_kb * 1024 + (headroom_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint; negative numbers as its 64-bit two's complement."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def table_block(items: list[tuple[bytes, bytes]], restart_interval: int) -> bytes:
    """A table block as TF's .index holds them: keys prefix-compressed between restart points, then the restart
    offsets and their count (little-endian uint32)."""
    body, restarts, previous = bytearray(), [], b""
    for number, (key, value) in enumerate(items):
        shared = 0
        if number % restart_interval:
            while shared < min(len(key), len(previous)) and key[shared] == previous[shared]:
                shared += 1
        else:
            restarts.append(len(body))
        body += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
        previous = key
    return bytes(body + b"".join(struct.pack("<I", offset) for offset in restarts) + struct.pack("<I", len(restarts)))


def poll(condition: Callable[[], Any], deadline: float, interval: float = 0.1) -> Any:
    """``condition()``'s first true value, asked every ``interval`` s until ``deadline`` (monotonic); else None."""
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return None


def run_trials(
    tally: Any, trials: int, seconds: float, keep: bool, prefix: str, trial: Callable[[int, Path], None]
) -> None:
    """``trial(number, workdir)`` in a fresh folder each, at most ``trials``, none started after ``seconds``.

    ``tally`` counts ``trials`` and collects ``problems``; a trial's folder (logs, model_dir) stays for reading
    when it added a problem, or with ``keep``."""
    stop_at = time.monotonic() + seconds
    for number in range(trials):
        if time.monotonic() > stop_at:
            break
        workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}_{number}_"))
        problems = len(tally.problems)
        try:
            trial(number, workdir)
        finally:
            tally.trials += 1
            if not keep and len(tally.problems) == problems:
                shutil.rmtree(workdir, ignore_errors=True)
