"""TrainState, the run's one state object, and the RNG snapshot that goes with it.

Hooks read TrainState; the checkpoint stores what ``TrainState.state_dict()``
returns (global step, this replica's input position and generator states).
Nothing else keeps run state: no global step variable, no collections.

Best-so-far records are not kept here on purpose: an evaluation comes after
the checkpoint of its step is written, so the record lives in
``model_dir/best.json`` (best.py), written once that evaluation is known.
"""

from __future__ import annotations

import base64
import dataclasses
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass
class TrainState:
    """Where a run is; hooks read it, the checkpoint stores its ``state_dict()``."""

    global_step: int = 0
    """Optimizer steps taken since the model was created (across restarts)."""
    start_step: int = 0
    """global_step when this train call began (after restore)."""
    input_position: dict[str, Any] | None = None
    """Where the input stood after the last batch consumed, for inputs that can resume."""
    last_loss: float | None = None
    """Loss of the most recent step, once something asked for it as a float."""
    mode: str = "train"

    @property
    def epoch(self) -> int | None:
        """The input's epoch, for inputs that report one in their position (te.numpy_input_fn, ...)."""
        position = self.input_position
        epoch = position.get("epoch") if isinstance(position, Mapping) else None
        return epoch if isinstance(epoch, int) else None

    def state_dict(self) -> dict[str, Any]:
        """This replica's part of the checkpoint: step, input position and generator states (JSON values)."""
        return {"global_step": self.global_step, "input_position": self.input_position, "rng": capture_rng_state()}

    def load_state_dict(self, state: Mapping[str, Any], *, restore_rng: bool = True) -> None:
        """Puts back what state_dict returned; generator states only when ``restore_rng``."""
        self.global_step = int(state["global_step"])
        self.input_position = state.get("input_position")
        if restore_rng and state.get("rng") is not None:
            restore_rng_state(state["rng"])


def _encode_tensor(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _decode_byte_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def _cuda_initialized() -> bool:
    """CUDA is available and this process already initialised it (asking initialises nothing)."""
    # torch leaves is_initialized unannotated.
    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def capture_rng_state() -> dict[str, Any]:
    """The python, numpy and torch generator states, as JSON-serialisable values."""
    version, internal, gauss = random.getstate()
    # The global generator is an MT19937, whose legacy state is this tuple; numpy's stub also allows a dict.
    numpy_state: tuple[str, np.ndarray, int, int, float] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    kind, keys, position, has_gauss, cached = numpy_state
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
        "torch": _encode_tensor(torch.get_rng_state()),
    }
    if _cuda_initialized():
        state["cuda"] = [_encode_tensor(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Puts back what capture_rng_state saved."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(_decode_byte_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = [_decode_byte_tensor(s) for s in state["cuda"]]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


@contextmanager
def rng_preserved() -> Iterator[None]:
    """Runs the body without moving any generator the training loop draws from.

    Evaluation inside training (input shuffling, the user's model_fn) must not
    change the random numbers training draws next, so that training with
    evaluations gives the weights of training without them.
    """
    python, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if _cuda_initialized() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
