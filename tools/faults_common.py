"""What the fault tools share: reading under a memory cap, and protobuf varints for crafting records.

A reader that allocates what a crafted length declares should fail here with
MemoryError instead of taking the machine, so the fault tools and tests run
their readers in a process whose address space is capped at what it maps
already plus some headroom.
"""

from __future__ import annotations

import resource


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
