"""TrainState, the one typed state object, and the RNG snapshot that goes with it.

Hooks see TrainState; state.json stores it. Nothing else keeps run state:
no global step variable, no collections.
"""

from __future__ import annotations

import base64
import dataclasses
import random
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass
class TrainState:
    """Where a run is; hooks read it, the checkpoint stores it."""

    global_step: int = 0
    """Optimizer steps taken since the model was created (across restarts)."""
    start_step: int = 0
    """global_step when this train call began (after restore)."""
    input_position: dict[str, Any] | None = None
    """Where the input stood after the last batch consumed, for inputs that can resume."""
    last_loss: float | None = None
    """Loss of the most recent step, once something asked for it as a float."""
    mode: str = "train"

    def to_json(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "input_position": self.input_position}


def _encode_tensor(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _decode_byte_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng_state() -> dict[str, Any]:
    """The python, numpy and torch generator states, as JSON-serialisable values."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
        "torch": _encode_tensor(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
