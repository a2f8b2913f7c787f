"""Keeping Python's garbage collector off the served models: freeze them once loaded, collect each once retired.

A full (generation 2) collection walks every object the collector tracks. Three exported programs are about
335k of them, so a full collection set off by ordinary request garbage stalls every request in flight for
about 230 ms on this machine: that was the whole tail of the batching p99 at 32 clients. ``gc.freeze()``
moves every tracked object into a generation the collector never walks; after it a full collection walks
only what requests made.

Frozen objects are still freed by reference counting; only reference cycles among them outlive their last
reference, and an unloaded version's graph is full of cycles. So when a version is no longer served, the heap
is unfrozen, collected and frozen again, and that is repeated on later polls (at growing intervals, a bounded
number of times) until the version is really gone: a request that still holds it keeps it alive until the
request ends, and only then can a collection free it.

Only ``torchestimator serve`` freezes: it owns its process. ``start()`` serves inside a user's process, whose
heap is not ours to freeze.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections.abc import Iterable

__all__ = ["FrozenHeap"]

logger = logging.getLogger(__name__)

# A retired version is looked for at these polls after it was unloaded (1 s apart by default: about two
# minutes in all, far past any request's timeout); each look is one full collection.
_LOOK_AT_POLLS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Retired:
    def __init__(self, name: str, reference: weakref.ref[object]) -> None:
        self.name = name
        self.reference = reference
        self.polls = 0


class FrozenHeap:
    """Freezes the heap after loads; collects after unloads until the unloaded models are freed.

    ``settle(served)`` is called after every poll with the models served now (any objects that support weak
    references), from whichever thread polled.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served: dict[int, tuple[str, weakref.ref[object]]] = {}  # id -> (name, weak reference)
        self._retired: list[_Retired] = []

    @property
    def retired_count(self) -> int:
        """How many unloaded models are still waiting to be freed."""
        return len(self._retired)

    def settle(self, served: Iterable[tuple[str, object]]) -> None:
        """Takes ``(name, model)`` pairs of what is served now; freezes new ones, looks for retired ones."""
        with self._lock:
            now = {id(model): (name, model) for name, model in served}
            # Compared by identity through the weak references: an id may be reused once its object is freed.
            loaded = [
                key for key, (_, model) in now.items() if key not in self._served or self._served[key][1]() is not model
            ]
            for key, (name, reference) in self._served.items():
                model = reference()
                if model is not None and (key not in now or now[key][1] is not model):
                    self._retired.append(_Retired(name, reference))
            model = None
            self._served = {key: (name, weakref.ref(model)) for key, (name, model) in now.items()}
            del now  # no strong reference of ours may keep a model alive through the collection below
            due = self._due_retired()
            if due:
                self._collect_retired(due)
            elif loaded:
                # What the load left behind is still young: collect it (cheap: the rest is frozen), then freeze
                # the new model with everything else.
                gc.collect()
                gc.freeze()

    def _due_retired(self) -> list[_Retired]:
        due = []
        for retired in self._retired:
            retired.polls += 1
            if retired.polls in _LOOK_AT_POLLS:
                due.append(retired)
        return due

    def _collect_retired(self, due: list[_Retired]) -> None:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        alive = []
        for retired in self._retired:
            if retired.reference() is None:
                logger.debug("%s: an unloaded version was freed", retired.name)
            elif retired in due and retired.polls == _LOOK_AT_POLLS[-1]:
                logger.warning(
                    "%s: an unloaded version is still referenced %d polls after it was unloaded; "
                    "its memory is kept (something outside the server holds it)",
                    retired.name,
                    retired.polls,
                )
            else:
                alive.append(retired)
        self._retired = alive
