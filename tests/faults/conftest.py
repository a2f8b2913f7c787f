"""The fault suite: kills, damaged and crafted files, full disks, hostile requests.

Every test here is marked ``slow`` and ``faults`` (run in CI; select them alone
with ``-m faults``). Each loop is bounded in count and in time. Longer runs of
the same faults live in ``tools/faults_*.py``, each ending with one summary line.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/faults/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.faults)
