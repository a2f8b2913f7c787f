"""ExportOutput classes (TF's PredictOutput, ClassificationOutput, RegressionOutput) and signature planning.

A model_fn puts ``{signature_name: ExportOutput}`` in EstimatorSpec.export_outputs
to shape the served signatures; without it, one ``serving_default`` predict
signature carries every prediction. The rules for defaults follow TF's
``get_export_outputs``; how a signature names its inputs follows TF's
``classification_signature_def`` / ``regression_signature_def``
(``signature_input_names``).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "DEFAULT_SERVING_SIGNATURE_DEF_KEY",
    "ClassificationOutput",
    "ExportOutput",
    "PredictOutput",
    "RegressionOutput",
    "resolve_export_outputs",
]

DEFAULT_SERVING_SIGNATURE_DEF_KEY = "serving_default"
EXAMPLES_INPUT_KEY = "inputs"
"""TF's signature_constants.CLASSIFY_INPUTS and REGRESS_INPUTS: the key of the one input (serialized tf.Examples)
of a classify or regress signature."""


class ExportOutput(abc.ABC):
    """One signature's outputs; ``method`` is predict, classify or regress."""

    method: str = ""
    method_name: str = ""

    @property
    @abc.abstractmethod
    def outputs(self) -> dict[str, torch.Tensor]:
        """The tensors this signature returns, by output name."""


class PredictOutput(ExportOutput):
    """Any named tensors (a single tensor is named "output")."""

    method = "predict"
    method_name = "tensorflow/serving/predict"

    def __init__(self, outputs: torch.Tensor | Mapping[str, torch.Tensor]) -> None:
        if isinstance(outputs, torch.Tensor):
            outputs = {"output": outputs}
        if not isinstance(outputs, Mapping) or not outputs:
            raise ValueError(f"PredictOutput takes a tensor or a non-empty dict of tensors; received {outputs!r:.200}.")
        for key, value in outputs.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"PredictOutput keys must be non-empty strings; received {key!r}.")
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"PredictOutput output {key!r} must be a tensor; received {type(value).__name__}.")
        self._outputs = dict(outputs)

    @property
    def outputs(self) -> dict[str, torch.Tensor]:
        return dict(self._outputs)


class ClassificationOutput(ExportOutput):
    """Class scores and/or class ids, under TF's output names "scores" and "classes".

    TF requires string classes and a single serialized-Example input; here
    classes may be any tensor (ids or codes) and any receiver inputs are allowed
    (over one string input, the signature calls it "inputs" as TF does:
    ``signature_input_names``).
    """

    method = "classify"
    method_name = "tensorflow/serving/classify"

    def __init__(self, scores: torch.Tensor | None = None, classes: torch.Tensor | None = None) -> None:
        if scores is None and classes is None:
            raise ValueError("ClassificationOutput needs scores, classes or both; received neither.")
        if scores is not None and not (isinstance(scores, torch.Tensor) and scores.is_floating_point()):
            raise TypeError(
                f"ClassificationOutput scores must be a floating-point tensor; received {_describe(scores)}."
            )
        if classes is not None and not isinstance(classes, torch.Tensor):
            raise TypeError(f"ClassificationOutput classes must be a tensor; received {_describe(classes)}.")
        self.scores, self.classes = scores, classes

    @property
    def outputs(self) -> dict[str, torch.Tensor]:
        named = {"classes": self.classes, "scores": self.scores}
        return {key: value for key, value in named.items() if value is not None}


class RegressionOutput(ExportOutput):
    """One floating-point value per example, under TF's output name "outputs"."""

    method = "regress"
    method_name = "tensorflow/serving/regress"

    def __init__(self, value: torch.Tensor) -> None:
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            raise TypeError(f"RegressionOutput value must be a floating-point tensor; received {_describe(value)}.")
        self.value = value

    @property
    def outputs(self) -> dict[str, torch.Tensor]:
        return {"outputs": self.value}


def resolve_export_outputs(spec: Any) -> dict[str, ExportOutput]:
    """The signatures an EstimatorSpec exports, with TF's defaults.

    None -> serving_default predicting every prediction; one entry under another
    name is also served as serving_default; several without serving_default is
    an error (the server would not know which to use by default).
    """
    export_outputs = spec.export_outputs
    if export_outputs is None:
        return {DEFAULT_SERVING_SIGNATURE_DEF_KEY: PredictOutput(spec.predictions)}
    if not isinstance(export_outputs, Mapping) or not export_outputs:
        raise TypeError(
            "EstimatorSpec.export_outputs must be a non-empty dict of signature name -> ExportOutput "
            f"(PredictOutput, ClassificationOutput, RegressionOutput); received {export_outputs!r:.200}."
        )
    bad_names = [name for name in export_outputs if not isinstance(name, str) or not name]
    if bad_names:
        raise ValueError(f"export_outputs keys must be non-empty signature names; received {bad_names[0]!r}.")
    # Every wrong entry in one message: a spec usually builds them all the same way.
    wrong = [
        f"export_outputs[{name!r}] is a {type(output).__name__}"
        for name, output in export_outputs.items()
        if not isinstance(output, ExportOutput)
    ]
    if wrong:
        raise TypeError(
            f"{'; '.join(wrong)}: each must be a PredictOutput, ClassificationOutput or "
            "RegressionOutput (from torchestimator.export)."
        )
    resolved: dict[str, ExportOutput] = dict(export_outputs)
    if DEFAULT_SERVING_SIGNATURE_DEF_KEY not in resolved:
        if len(resolved) > 1:
            raise ValueError(
                f"export_outputs has several signatures {sorted(resolved)} and none named "
                f"{DEFAULT_SERVING_SIGNATURE_DEF_KEY!r}; name the one clients get by default {DEFAULT_SERVING_SIGNATURE_DEF_KEY!r}."
            )
        resolved[DEFAULT_SERVING_SIGNATURE_DEF_KEY] = next(iter(resolved.values()))
    return resolved


def signature_input_names(method: str, receiver_tensors: Mapping[str, Any]) -> dict[str, str]:
    """{signature input name: receiver input name} for a signature of ``method`` over these receiver inputs.

    A classify or regress signature over exactly one string input names it
    "inputs", whatever the receiver calls it ("examples" for
    build_parsing_serving_input_receiver), as TF's classification and
    regression signature defs do, so clients written for TF Serving find it
    there (metadata, Predict on that signature). Every other signature keeps
    the receiver's names, classify and regress over tensor inputs included
    (TF exports no such signature).
    """
    if method in ("classify", "regress") and len(receiver_tensors) == 1:
        name, spec = next(iter(receiver_tensors.items()))
        if spec.is_string:
            return {EXAMPLES_INPUT_KEY: name}
    return {name: name for name in receiver_tensors}


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__
