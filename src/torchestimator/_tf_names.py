"""TensorFlow's spellings and torchestimator's: the one table behind the TF aliases and the docs' name table.

A user pastes tf.estimator code: ``RunConfig(tf_random_seed=42)``, ``ModeKeys.INFER``,
``BestExporter(serving_input_receiver_fn=...)``, ``te.estimator.RunConfig``. Each row of ``TF_NAMES`` says
what TF's name is here, and is one line of the table on docs/tf-names.md ("tf.estimator names")
(``markdown_table``; tests/test_tf_names.py checks the page holds it and that each row does what it says):

- a documentation row: TF's name and ours, nothing to run;
- an alias: TF's argument or attribute means what ours means, so it is accepted (our own name stays the
  documented one; the alias logs one DEBUG line);
- a refusal: TF's name means something else here, so it fails with "TF's X is torchestimator's Y: what
  differs" (a ConfigTypeError for an argument, an AttributeError for a name in ``te.estimator``);
- a member: a name of the ``te.estimator`` namespace (tf.estimator's layout), the same object as ours.

What belongs here: the rows, and the helpers that apply them (``accepts_tf_arguments`` for a class's
``__init__``, ``accepts_tf_keywords`` for a function or method, ``tf_attribute_aliases`` for a class's
attributes, ``refused_member`` for a namespace). What
does not: the objects themselves. This is a leaf: it imports none of the modules that use it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from torchestimator.errors import ConfigTypeError

__all__ = [
    "TF_NAMES",
    "TFName",
    "accepts_tf_arguments",
    "accepts_tf_keywords",
    "argument_rows",
    "markdown_table",
    "our_arguments",
    "refused_member",
    "tf_attribute_aliases",
]

logger = logging.getLogger("torchestimator")

DOCUMENTED, ARGUMENT, ATTRIBUTE, MEMBER = "documented", "argument", "attribute", "member"


@dataclasses.dataclass(frozen=True)
class TFName:
    """One row: TF's spelling, ours, and (for an alias, a refusal or a member) what applies it."""

    tf: str
    """TF's spelling, as docs/tf-names.md shows it (markdown)."""
    ours: str
    """torchestimator's, as docs/tf-names.md shows it (markdown)."""
    notes: str = ""
    kind: str = DOCUMENTED
    """DOCUMENTED (the docs only), ARGUMENT, ATTRIBUTE or MEMBER (of a namespace)."""
    owners: tuple[str, ...] = ()
    """Whose argument or attribute (class names: "RunConfig"; a method: "Estimator.export_saved_model"), or which
    namespace ("tf.estimator")."""
    tf_key: str = ""
    """TF's argument, attribute or member name."""
    our_key: str = ""
    """Ours, for an alias or a member (a member: a dotted path from the package, "export.BestExporter")."""
    differs: str = ""
    """For a refusal: what differs (non-empty refuses TF's name)."""

    def refusal(self) -> str:
        """The message a refused name raises."""
        return f"TF's {_plain(self.tf)} is torchestimator's {_plain(self.ours)}: {self.differs}"

    def markdown(self) -> str:
        if self.differs:
            notes = f"refused, saying: {self.differs}"
        elif self.kind in (ARGUMENT, ATTRIBUTE):
            notes = "TF's name is accepted" + (f"; {self.notes}" if self.notes else "")
        else:
            notes = self.notes
        return f"| {self.tf} | {self.ours} | {notes} |" if notes else f"| {self.tf} | {self.ours} | |"


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


def _documented(tf: str, ours: str, notes: str = "") -> TFName:
    return TFName(tf, ours, notes)


def _member(namespace: str, name: str, ours: str, notes: str = "") -> TFName:
    """``tf.estimator.<name>`` is ``torchestimator.<ours>``, reachable as ``te.estimator.<name>``."""
    return TFName(f"`{namespace}.{name}`", f"`te.{ours}`", notes, MEMBER, (namespace,), name, ours)


def _refused_member(namespace: str, name: str, ours: str, differs: str) -> TFName:
    return TFName(f"`{namespace}.{name}`", ours, "", MEMBER, (namespace,), name, "", differs)


def _argument(owners: tuple[str, ...], tf: str, ours: str, tf_key: str, our_key: str, notes: str = "") -> TFName:
    return TFName(tf, ours, notes, ARGUMENT, owners, tf_key, our_key)


def _refused_argument(owners: tuple[str, ...], tf: str, ours: str, tf_key: str, differs: str) -> TFName:
    return TFName(tf, ours, "", ARGUMENT, owners, tf_key, "", differs)


_EXPORTERS = ("LatestExporter", "BestExporter", "FinalExporter")
_HOOK_METHODS = "its methods are begin, after_restore, before_step, after_step and end, and there is no session"
_CANNED = "a canned estimator's network is a torch module here: give it with its loss and metrics."
_ESTIMATOR, _EXPORT, _EXPERIMENTAL = "tf.estimator", "tf.estimator.export", "tf.estimator.experimental"
_EXPORT_METHOD = "Estimator.export_saved_model"

TF_NAMES: tuple[TFName, ...] = (
    # -- tf.estimator's own names: te.estimator.X is the object te.X (or te.export.X) is.
    _member(
        _ESTIMATOR,
        "Estimator",
        "Estimator",
        "`te.Estimator(model_fn, model, optimizer, model_dir, config, params, warm_start_from, lr_scheduler=)`: "
        "the model and optimizer are factories; the framework owns the step",
    ),
    _documented(
        "`model_fn(features, labels, mode, params, config)`",
        "same, plus `model`",
        "arguments are passed by name, only those declared",
    ),
    _documented(
        "`tf.keras.estimator.model_to_estimator`, Keras `compile` + `fit`",
        "`te.Estimator.from_module(module, loss, optimizer, metrics)`",
        "loss/optimizer/metrics by Keras names or callables",
    ),
    _member(_ESTIMATOR, "ModeKeys", "ModeKeys", 'same strings (`"train"`, `"eval"`, `"infer"`)'),
    TFName(
        "`tf.contrib.learn.ModeKeys.INFER`",
        "`te.ModeKeys.PREDICT`",
        'the same string, `"infer"`',
        ATTRIBUTE,
        ("ModeKeys",),
        "INFER",
        "PREDICT",
    ),
    _member(_ESTIMATOR, "EstimatorSpec", "EstimatorSpec", "`train_op` optional: a callable doing a custom step"),
    _member(
        _ESTIMATOR,
        "RunConfig",
        "RunConfig",
        "same defaults; adds `device`, `mixed_precision`, `gradient_accumulation_steps`, `clip_grad_norm`, "
        "`deterministic`, `progress_bar`, `checkpoint_on_interrupt`, `storage_options`",
    ),
    _argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(tf_random_seed=)`",
        "`te.RunConfig(random_seed=)`",
        "tf_random_seed",
        "random_seed",
    ),
    _refused_argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(session_config=)`",
        "`te.RunConfig(device=, deterministic=)`",
        "session_config",
        "a ConfigProto configures a TF session, and torch has none: choose the device with device=, "
        "the CPU threads with torch.set_num_threads, and drop session_config.",
    ),
    _refused_argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(device_fn=)`",
        "`te.RunConfig(device=)`",
        "device_fn",
        "one torch device string (or torch.device) for the whole model, not a function placing each op.",
    ),
    _refused_argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(protocol=)`",
        "`te.RunConfig(train_distribute=)`",
        "protocol",
        "replicas talk through the strategy's torch.distributed backend (NCCL, gloo); there is no TF server "
        "protocol to choose: drop protocol.",
    ),
    _refused_argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(experimental_distribute=)`",
        "`te.RunConfig(train_distribute=, eval_distribute=)`",
        "experimental_distribute",
        "DistributeConfig's strategies are given as these two fields themselves.",
    ),
    _refused_argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(experimental_max_worker_delay_secs=)`",
        "the process group forming before step 1",
        "experimental_max_worker_delay_secs",
        "workers are not started one after another: every replica joins the process group before training "
        "starts, so there is no delay to bound; drop it.",
    ),
    _refused_argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(session_creation_timeout_secs=)`",
        "the strategy's process-group timeout",
        "session_creation_timeout_secs",
        "there is no session to create; how long replicas wait for each other is the distribute strategy's "
        "setting: drop session_creation_timeout_secs.",
    ),
    _refused_argument(
        ("RunConfig",),
        "`tf.estimator.RunConfig(checkpoint_save_graph_def=)`",
        "the checkpoint's state_dict",
        "checkpoint_save_graph_def",
        "there is no graph: a checkpoint holds the module's state_dict, the optimizer's and the train state; "
        "drop checkpoint_save_graph_def.",
    ),
    _documented("`Estimator.train / evaluate / predict`", "same names and arguments"),
    _documented(
        "`Estimator.latest_checkpoint / get_variable_names / get_variable_value / eval_dir`",
        "same",
        "variable names are state_dict keys",
    ),
    _member(_ESTIMATOR, "TrainSpec", "TrainSpec", "same arguments (after `input_fn`, by keyword)"),
    _member(_ESTIMATOR, "EvalSpec", "EvalSpec", "same arguments (after `input_fn`, by keyword); adds `every_n_steps`"),
    _member(
        _ESTIMATOR,
        "train_and_evaluate",
        "train_and_evaluate",
        "a list of EvalSpecs; `best=` and `early_stopping=` keep the best and stop",
    ),
    _member(_ESTIMATOR, "WarmStartSettings", "WarmStartSettings", "sources: any format `inspect` reads"),
    _documented(
        "`Estimator(warm_start_from=...)`",
        "same",
        "a path or `te.WarmStartSettings`; applied to a fresh `model_dir` only",
    ),
    _documented(
        "`tf.compat.v1.train.init_from_checkpoint(ckpt, assignment_map)`",
        "`torchestimator.warm_start.plan_init_from_checkpoint(module, source, assignment_map)`",
        "`.apply(module)`",
    ),
    _documented(
        "`tf.train.list_variables / load_variable`",
        "`torchestimator.interop.open_weights(path).tensors() / .read(name)`",
    ),
    _documented(
        "`tf.compat.v1.estimator.inputs.numpy_input_fn / pandas_input_fn`",
        "`te.numpy_input_fn / te.pandas_input_fn`",
        "resumable; `batch_size` is global",
    ),
    _documented("`tf.data` pipeline in `input_fn`", "`te.dataset_input_fn(dataset, ...)` or any iterable"),
    _documented("`tf.distribute.InputContext`", "`te.InputContext`"),
    _documented(
        "`tf.distribute.OneDeviceStrategy / MirroredStrategy`",
        "`te.OneDeviceStrategy / te.MirroredStrategy`",
        "DDP over N processes",
    ),
    _documented("`TF_CONFIG`", "`torchestimator.distribute.cluster_from_tf_config`", "also torchrun variables"),
    _documented(
        "`tf.compat.v1.metrics.*` / `tf.keras.metrics` in `eval_metric_ops`",
        "`te.metrics.mean, accuracy, precision, recall, auc, mean_squared_error, root_mean_squared_error, "
        "mean_absolute_error, from_torchmetrics`",
        "on torchmetrics",
    ),
    # -- hooks
    _refused_member(
        _ESTIMATOR,
        "SessionRunHook",
        "`te.Hook`",
        f"{_HOOK_METHODS}, so a SessionRunHook's before_run/after_run would never be called: subclass te.Hook.",
    ),
    _refused_member(
        _ESTIMATOR,
        "SessionRunArgs",
        "`te.RunContext`",
        "nothing is fetched through session.run: a hook reads run_context.loss, .spec (the EstimatorSpec), "
        ".features and .state.",
    ),
    _refused_member(
        _ESTIMATOR,
        "SessionRunContext",
        "`te.RunContext`",
        "a hook gets a te.RunContext (request_stop(), loss, spec, state), with no session or original_args.",
    ),
    _member(_ESTIMATOR, "StopAtStepHook", "StopAtStepHook"),
    _member(_ESTIMATOR, "LoggingTensorHook", "LoggingTensorHook", "logs `loss`, `step` or prediction keys"),
    _member(_ESTIMATOR, "StepCounterHook", "StepCounterHook"),
    _member(_ESTIMATOR, "CheckpointSaverHook", "CheckpointSaverHook"),
    _member(_ESTIMATOR, "CheckpointSaverListener", "CheckpointSaverListener"),
    _member(_ESTIMATOR, "SummarySaverHook", "SummarySaverHook"),
    _refused_member(
        _ESTIMATOR,
        "NanTensorHook",
        "the training loop's NaN guard",
        "the loop itself raises te.NanLossDuringTrainingError on a loss that is not finite: drop the hook.",
    ),
    _member(_ESTIMATOR, "NanLossDuringTrainingError", "NanLossDuringTrainingError"),
    _refused_member(
        _ESTIMATOR,
        "SecondOrStepTimer",
        "`te.Every(steps=...)` / `te.Every(secs=...)`",
        "a trigger given to hooks (te.hooks.PeriodicHook for your own), taking steps= or secs=, "
        "not every_steps=/every_secs=.",
    ),
    _refused_member(
        _ESTIMATOR,
        "ProfilerHook",
        "`torch.profiler` in a `te.Hook`",
        "TF's timeline files have no counterpart: start torch.profiler in a te.Hook's begin and step it in after_step.",
    ),
    _refused_member(
        _ESTIMATOR,
        "GlobalStepWaiterHook",
        "the process group forming before step 1",
        "replicas start together, so no worker waits for a global step: drop the hook.",
    ),
    _refused_member(
        _ESTIMATOR, "DNNClassifier", "`te.Estimator.from_module(module, loss, optimizer, metrics)`", _CANNED
    ),
    _refused_member(
        _ESTIMATOR, "DNNRegressor", "`te.Estimator.from_module(module, loss, optimizer, metrics)`", _CANNED
    ),
    _refused_member(
        _ESTIMATOR, "LinearClassifier", "`te.Estimator.from_module(module, loss, optimizer, metrics)`", _CANNED
    ),
    _refused_member(
        _ESTIMATOR, "LinearRegressor", "`te.Estimator.from_module(module, loss, optimizer, metrics)`", _CANNED
    ),
    # -- early stopping, the best model
    _member(
        _EXPERIMENTAL,
        "stop_if_no_increase_hook",
        "stop_if_no_increase_hook",
        "a rule for `train_and_evaluate(early_stopping=)`, reading evaluation results directly; also "
        "`te.EarlyStopping(patience=...)`",
    ),
    _member(_EXPERIMENTAL, "stop_if_no_decrease_hook", "stop_if_no_decrease_hook"),
    _member(_EXPERIMENTAL, "stop_if_higher_hook", "stop_if_higher_hook"),
    _member(_EXPERIMENTAL, "stop_if_lower_hook", "stop_if_lower_hook"),
    _documented("(hand-written best-checkpoint hooks)", "`te.BestCheckpointPolicy`, `Estimator.best_checkpoint()`"),
    # -- export
    _member(_ESTIMATOR, "Exporter", "export.Exporter"),
    _member(_ESTIMATOR, "LatestExporter", "export.LatestExporter"),
    _member(_ESTIMATOR, "BestExporter", "export.BestExporter", "the best survives restarts in `best_eval.json`"),
    _member(_ESTIMATOR, "FinalExporter", "export.FinalExporter"),
    _argument(
        _EXPORTERS,
        "`tf.estimator.LatestExporter / BestExporter / FinalExporter(serving_input_receiver_fn=)`",
        "`te.export.LatestExporter / BestExporter / FinalExporter(serving_input_receiver=)`",
        "serving_input_receiver_fn",
        "serving_input_receiver",
        "a receiver, or a function returning one",
    ),
    _refused_argument(
        _EXPORTERS,
        "`tf.estimator.LatestExporter / BestExporter / FinalExporter(as_text=)`",
        "`program.json` and `signature.json`",
        "as_text",
        "an export is a torch.export program with JSON signatures, not a SavedModel proto to write as "
        "text: drop as_text.",
    ),
    _refused_argument(
        ("BestExporter",),
        "`tf.estimator.BestExporter(event_file_pattern=)`",
        "`best_eval.json` in the exporter's folder",
        "event_file_pattern",
        "BestExporter records the best result it exported (best_eval.json) and compares the next ones with "
        "it; it does not re-read event files: drop event_file_pattern.",
    ),
    _documented(
        "`Estimator.export_saved_model`",
        "`Estimator.export_saved_model`",
        "a torch.export program + signature.json",
    ),
    _argument(
        (_EXPORT_METHOD,),
        "`tf.estimator.Estimator.export_saved_model(serving_input_receiver_fn=)`",
        "`Estimator.export_saved_model(serving_input_receiver=)`",
        "serving_input_receiver_fn",
        "serving_input_receiver",
        "a receiver, or a function returning one",
    ),
    _refused_argument(
        (_EXPORT_METHOD,),
        "`tf.estimator.Estimator.export_saved_model(as_text=)`",
        "`program.json` and `signature.json`",
        "as_text",
        "an export is a torch.export program with JSON signatures, not a SavedModel proto to write as "
        "text: drop as_text.",
    ),
    _refused_argument(
        (_EXPORT_METHOD,),
        "`tf.estimator.Estimator.export_saved_model(experimental_mode=)`",
        "the PREDICT mode only",
        "experimental_mode",
        "an export holds model_fn in PREDICT mode, what a server runs; TF's experimental TRAIN and EVAL "
        "exports have no counterpart: drop experimental_mode.",
    ),
    _member(
        _EXPORT,
        "ServingInputReceiver",
        "export.ServingInputReceiver",
        "`receiver_tensors` is a dict of `te.export.TensorSpec`; `te.export.serving_input_receiver({...})` builds one",
    ),
    _refused_argument(
        ("ServingInputReceiver",),
        "`tf.estimator.export.ServingInputReceiver(features=)`",
        "`te.export.ServingInputReceiver(receiver_fn=)`",
        "features",
        "the features are computed from the receiver tensors by receiver_fn (traced into the exported "
        "program); there are no graph tensors to pass. Without receiver_fn they are the receiver tensors.",
    ),
    _refused_argument(
        ("ServingInputReceiver",),
        "`tf.estimator.export.ServingInputReceiver(receiver_tensors_alternatives=)`",
        "one export per set of inputs",
        "receiver_tensors_alternatives",
        "an export takes one set of inputs; export the other receiver as a second model.",
    ),
    _refused_member(
        _EXPORT,
        "TensorServingInputReceiver",
        "`te.export.ServingInputReceiver(receiver_fn=)`",
        "receiver_fn may return one tensor, which model_fn then gets as its features.",
    ),
    _member(
        _EXPORT,
        "build_parsing_serving_input_receiver_fn",
        "export.build_parsing_serving_input_receiver_fn",
        "TF's form: returns the function; `te.export.build_parsing_serving_input_receiver(feature_spec)` "
        "returns the receiver",
    ),
    _member(
        _EXPORT,
        "build_raw_serving_input_receiver_fn",
        "export.build_raw_serving_input_receiver_fn",
        "features: a dict of example tensors or `TensorSpec`s, the first dimension the batch; "
        "`te.export.serving_input_receiver` is ours",
    ),
    _member(_EXPORT, "PredictOutput", "export.PredictOutput", "in `EstimatorSpec.export_outputs`"),
    _member(_EXPORT, "ClassificationOutput", "export.ClassificationOutput"),
    _member(_EXPORT, "RegressionOutput", "export.RegressionOutput"),
    _member(_EXPORT, "ExportOutput", "export.ExportOutput"),
    # -- data
    _documented(
        "`tf.data.TFRecordDataset`, `tf.io.TFRecordWriter`",
        "`torchestimator.data.TFRecordDataset`, `TFRecordWriter`, `read_records`",
    ),
    _documented(
        "`tf.train.Example` / `SequenceExample`",
        "`encode_example`, `decode_example`, `encode_sequence_example`, `decode_sequence_example`",
    ),
    _documented(
        "`tf.io.FixedLenFeature`, `VarLenFeature`, `FixedLenSequenceFeature`, `RaggedFeature`",
        "same names in `torchestimator.data`",
        "numpy results; `to_torch`",
    ),
    _documented(
        "`tf.io.parse_single_example`, `parse_example`, `parse_single_sequence_example`, `decode_raw`",
        "same names in `torchestimator.data`",
    ),
    _documented(
        "`tf.errors.DataLossError`", "`torchestimator.data.DataLossError`", "a ValueError with `.path`, `.offset`"
    ),
)

_Class = TypeVar("_Class", bound=type)
_Function = TypeVar("_Function", bound=Callable[..., Any])


def argument_rows(owner: str) -> dict[str, TFName]:
    """TF's argument name -> its row, for the arguments of ``owner`` (a class name, or "Class.method") the
    table names."""
    return {row.tf_key: row for row in TF_NAMES if row.kind == ARGUMENT and owner in row.owners}


def accepts_tf_keywords(owner: str) -> Callable[[_Function], _Function]:
    """A function (or method) decorator: it also takes TF's argument names of ``owner``'s rows, by keyword.

    An alias is renamed to ours (both given: a ConfigTypeError); a refused name raises its row's message.
    ``inspect.signature`` still shows our own arguments (the wrapper is ``functools.wraps``'d).
    """
    rows = argument_rows(owner)

    def decorate(function: _Function) -> _Function:
        @functools.wraps(function)
        def with_tf_keywords(*args: Any, **keywords: Any) -> Any:
            if not rows.keys().isdisjoint(keywords):
                keywords = _with_our_names(owner, rows, keywords)
            return function(*args, **keywords)

        return cast(_Function, with_tf_keywords)

    return decorate


def accepts_tf_arguments(owner: str) -> Callable[[_Class], _Class]:
    """A class decorator: the class's ``__init__`` also takes TF's argument names of ``owner``'s rows
    (``accepts_tf_keywords`` applied to it)."""

    def decorate(cls: _Class) -> _Class:
        init = cls.__init__  # type: ignore[misc]  # the class's own, wrapped once here
        setattr(cls, "__init__", accepts_tf_keywords(owner)(init))  # noqa: B010  (mypy refuses assigning to a method)
        return cls

    return decorate


def our_arguments(owner: str, keywords: dict[str, Any]) -> dict[str, Any]:
    """``keywords`` with TF's argument names of ``owner`` renamed to ours (refused ones raise their message)."""
    return _with_our_names(owner, argument_rows(owner), keywords)


def _with_our_names(owner: str, rows: Mapping[str, TFName], keywords: dict[str, Any]) -> dict[str, Any]:
    renamed = dict(keywords)
    for tf_key, row in rows.items():
        if tf_key not in renamed:
            continue
        if row.differs:
            raise ConfigTypeError(row.refusal(), field=tf_key, value=renamed[tf_key])
        if row.our_key in renamed:
            raise ConfigTypeError(
                f"{owner} got both {tf_key}= (TF's name) and {row.our_key}= (ours) for one setting; give one.",
                field=row.our_key,
                value=renamed[tf_key],
            )
        logger.debug("%s(%s=): TF's name for %s=.", owner, tf_key, row.our_key)
        renamed[row.our_key] = renamed.pop(tf_key)
    return renamed


def tf_attribute_aliases(owner: str) -> Callable[[_Class], _Class]:
    """A class decorator: TF's attribute names of ``owner``'s rows, each the value of ours (ModeKeys.INFER)."""

    def decorate(cls: _Class) -> _Class:
        for row in TF_NAMES:
            if row.kind == ATTRIBUTE and owner in row.owners:
                setattr(cls, row.tf_key, getattr(cls, row.our_key))
        return cls

    return decorate


def refused_member(namespace: str, name: str) -> str | None:
    """The message for ``namespace.name`` when TF has that name and it means something else here, else None."""
    for row in TF_NAMES:
        if row.kind == MEMBER and row.differs and row.tf_key == name and namespace in row.owners:
            return row.refusal()
    return None


def markdown_table() -> str:
    """docs/tf-names.md's table ("tf.estimator names"): one line per row of TF_NAMES."""
    lines = ["| tf.estimator | torchestimator | notes |", "|---|---|---|"]
    return "\n".join(lines + [row.markdown() for row in TF_NAMES]) + "\n"
