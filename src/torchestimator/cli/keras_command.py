"""`torchestimator convert keras-model FILE OUT`: a Keras model file as a torch module, saved for torch.

What belongs here: the argument parsing and the writing of the two outputs; the conversion itself is
``torchestimator.interop.keras_model``'s.

- ``OUT.safetensors``: the module's ``state_dict`` (rebuild the module with ``te.interop.keras_model(FILE)`` and
  ``load_state_dict``, or load the tensors into your own module);
- ``OUT.pt2``: a ``torch.export`` program with a dynamic batch dimension, which ``torch.export.load`` runs with
  torch alone (the inputs as Keras's: channels-last, or channels-first with --channels-first);
- ``OUT.py``: Python source defining the module (one line per layer call, named after the Keras layers), to
  own and edit, and ``OUT.safetensors`` beside it with the weights its ``load()`` reads.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_command"]

_SUFFIXES = (".safetensors", ".pt2", ".py")


def add_command(convert_commands: Any) -> None:
    """Adds ``keras-model`` under ``torchestimator convert``."""
    command = convert_commands.add_parser(
        "keras-model",
        help="a Keras .keras/.h5 model to a torch module's weights (.safetensors), a torch.export program (.pt2) "
        "or Python source (.py)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("file", help="the Keras model: .keras, .h5 saved with model.save, or weights with --config")
    command.add_argument("output", help="where to write: OUT.safetensors, OUT.pt2 or OUT.py (and OUT.safetensors)")
    command.add_argument(
        "--config",
        metavar="CONFIG.json",
        help="the architecture, for a weights-only FILE (.weights.h5): model.to_json()'s text, or a .keras's "
        "config.json",
    )
    command.add_argument(
        "--channels-first",
        action="store_true",
        help="take the inputs channels-first ([batch, channels, *spatial], torch's layout) instead of Keras's",
    )
    command.add_argument("--show", action="store_true", help="print the converted module's architecture")
    command.set_defaults(handler=convert_keras_model)


def convert_keras_model(args: argparse.Namespace) -> int:
    import torch

    from torchestimator.interop import keras_model

    output = os.fspath(args.output)
    if not output.endswith(_SUFFIXES):
        raise ValueError(f"convert keras-model: {output!r} must end with .safetensors, .pt2 or .py.")
    model = keras_model(args.file, config=args.config, channels_first=args.channels_first).eval()
    parameters = sum(parameter.numel() for parameter in model.parameters())
    if args.show:
        print(model)
    if output.endswith(".py"):
        from torchestimator.interop.keras_source import keras_model_source

        weights = output[: -len(".py")] + ".safetensors"
        source = keras_model_source(
            model, weights_file=os.path.basename(weights), converted_from=os.path.basename(os.fspath(args.file))
        )
        _save_weights(model, weights, args.file)
        with open(output, "w", encoding="utf-8") as file:
            file.write(source)
        output = f"{output} and {weights}"
    elif output.endswith(".safetensors"):
        _save_weights(model, output, args.file)
    else:
        program = _export(model, args.file)
        torch.export.save(program, output)
    print(
        f"converted {args.file}: {len(list(model.children()))} layers, {parameters} parameters, "
        f"inputs {', '.join(f'{name} {list(shape)} {dtype}' for name, shape, dtype in model.input_specs)}; "
        f"wrote {output}"
    )
    return 0


def _save_weights(model: Any, path: str, source: str) -> None:
    from safetensors.torch import save_file

    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, path, metadata={"converted_from": os.path.basename(os.fspath(source))})


def _export(model: Any, source: str) -> Any:
    """The module as a torch.export program whose batch dimension is dynamic (the other sizes as the file fixes)."""
    import torch

    if not model.input_specs or any(None in shape for _, shape, _ in model.input_specs):
        raise ValueError(
            f"convert keras-model: {source} leaves an input size open ({model.input_specs}); a .pt2 program needs "
            "fixed sizes besides the batch. Write .safetensors instead, or save the Keras model with fixed sizes."
        )
    examples = tuple(
        torch.zeros(2, *shape, dtype=getattr(torch, dtype if dtype in ("int32", "int64") else "float32"))
        for _, shape, dtype in model.input_specs
    )
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    return torch.export.export(model, examples, dynamic_shapes=(tuple({0: batch} for _ in examples),))
