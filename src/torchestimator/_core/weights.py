"""The model an Estimator builds, and the life of its weights: where they come from and what goes into it.

``ModelWeights`` builds the module once per process (or hands back the user's), restores into the plain module
(before any distribution wrapping) a checkpoint of model_dir, else the warm-start source, else keeps fresh or
in-process weights, and records where the weights came from (a ``WeightsOrigin``), so an unchanged checkpoint is
not read again. It also makes the plain, unsharded modules inference needs while FSDP2 holds shards:
``plain_module``, ``gathered_copy`` and ``GatheredWeights`` (a plain copy refreshed at each checkpoint).
The Estimator holds one and hands runs to the loops; checkpoint files are checkpoint/'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from torchestimator._core.arguments import checked_factory_result
from torchestimator._core.calling import call_factory
from torchestimator._core.config import RunConfig
from torchestimator._core.inference import FRESH, WeightsOrigin
from torchestimator._io import filesystems
from torchestimator._train_state import TrainState, rng_preserved, seed_everything
from torchestimator.checkpoint.parts import holds_shards, load_model_state
from torchestimator.checkpoint.store import Checkpoint, CheckpointStore
from torchestimator.distribute.sync_batch_norm import copy_sharing_process_groups
from torchestimator.hooks.base import CheckpointSaverListener
from torchestimator.interop import open_weights
from torchestimator.interop.source import WeightSource
from torchestimator.warm_start import WarmStartSettings, warm_start

if TYPE_CHECKING:
    from torchestimator._core.loop import TrainingRun

logger = logging.getLogger("torchestimator")

ModelFactory = Callable[..., torch.nn.Module]


class ModelWeights:
    """An Estimator's model: the module built from ``source``, and where the weights it holds came from."""

    def __init__(
        self,
        source: torch.nn.Module | ModelFactory,
        *,
        params: dict[str, Any],
        config: RunConfig,
        model_dir: str,
        store: CheckpointStore,
        warm_start: WarmStartSettings | None,
    ) -> None:
        self.source = source
        # The call and argument the user named the model in, for errors about what its factory returns.
        self.argument = ("Estimator", "model")
        # A path (any format open_weights reads) or WarmStartSettings; used only while model_dir has no checkpoint.
        self.warm_start = warm_start
        self._params = params
        self._config = config
        self._model_dir = model_dir
        self._store = store
        self.module: torch.nn.Module | None = None
        # Where the built module's weights came from; saves re-reading an unchanged checkpoint.
        self.origin: WeightsOrigin = FRESH
        self.live_run: TrainingRun | None = None  # while train() runs: the weights change under the record
        # A copy of a user-given module taken before FSDP2 sharded it in place: plain modules are made from it.
        self.plain_template: torch.nn.Module | None = None

    # -- building ---------------------------------------------------------

    def build(self, device: torch.device) -> torch.nn.Module:
        """The module, built once per process, on ``device``."""
        if self.module is None:
            if self._config.random_seed is not None:  # the initial weights are the seed's whichever call builds them
                seed_everything(self._config.random_seed)
            self.module = self.new_module()
        return self.module.to(device)

    def new_module(self) -> torch.nn.Module:
        source = self.source
        if isinstance(source, torch.nn.Module):
            return source
        call, field = self.argument
        module = call_factory(source, self._params, None, first_is_params=True)
        built: torch.nn.Module = checked_factory_result(
            module,
            f"{call}({field}=...)",
            field,
            "an nn.Module (a model instance)",
            lambda value: isinstance(value, torch.nn.Module),
        )
        return built

    def now(self) -> WeightsOrigin:
        """Where the built module's weights come from now; during training, from the live run."""
        run = self.live_run
        if run is None:
            return self.origin
        checkpointer, step = run.checkpointer, run.state.global_step
        if checkpointer is not None and checkpointer.published_step == step and checkpointer.last_saved_path:
            return WeightsOrigin("checkpoint", step, checkpointer.last_saved_path)
        return WeightsOrigin("training", step)

    def on(self, device: torch.device) -> tuple[torch.nn.Module, WeightsOrigin]:
        """The module for inference on ``device`` and the weights it holds.

        While training runs it is a copy of the live module (its weights now), so that loading other
        weights, moving it or switching it to eval mode leaves training alone.
        """
        if self.live_run is None:
            return self.build(device), self.origin
        live = self.live_run.parts.model
        if holds_shards(live):
            # A copy would hold this replica's shards only: inference gets a plain module and a checkpoint's weights.
            return self.plain_module().to(device), FRESH
        return copy_sharing_process_groups(live).to(device), self.now()

    def plain_module(self) -> torch.nn.Module:
        """A new, unsharded module of this Estimator's model (its weights are the caller's to load)."""
        if self.plain_template is not None:
            return copy_sharing_process_groups(self.plain_template)
        with rng_preserved():  # building draws initial weights; training's random streams stay where they are
            return self.new_module()

    def gathered_copy(self, sharded: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """A plain module holding a sharded module's whole weights; a collective, every replica calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        whole = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True))
        plain = self.plain_module().to(device)
        plain.load_state_dict(whole)
        return plain

    # -- loading ----------------------------------------------------------

    def restore(self, module: torch.nn.Module, checkpoint: Checkpoint | None, state: TrainState) -> None:
        """Loads a checkpoint into the plain module (before any distribution wrapping)."""
        current = self.origin
        if checkpoint is None:
            if current.source != "init":
                # Trained (or warm-started) in this process without checkpoints: keep those weights.
                state.global_step = current.step
            elif self.warm_start is not None:
                self.apply_warm_start(module, self.warm_start)
            else:
                logger.info("No checkpoint in %s: starting from freshly initialised weights.", self._model_dir)
            return
        if not current.holds(checkpoint.path):
            self.load_checkpoint(module, checkpoint, current)
        state.global_step = checkpoint.step

    def for_inference(
        self,
        module: torch.nn.Module,
        current: WeightsOrigin,
        checkpoint_path: str | None,
        give_shapes: Callable[[torch.nn.Module], None] | None = None,
    ) -> WeightsOrigin:
        """Puts the weights inference uses into ``module`` (which holds ``current``); returns where they came from.

        ``give_shapes`` materialises lazy layers (a dry forward on the caller's input) before a warm start, which
        needs every shape; a checkpoint gives them its own.
        """
        path = checkpoint_path or self._store.latest_checkpoint()
        if path is None and not self._store.has_checkpoints():
            if current.in_process:
                logger.info(
                    "No checkpoint in %s: using the weights %s in this process.",
                    self._model_dir,
                    "trained" if current.source == "training" else "warm-started",
                )
                return current
            if self.warm_start is not None:  # as tf.estimator: evaluate/predict without a checkpoint use it
                if give_shapes is not None:
                    give_shapes(module)
                return self.apply_warm_start(module, self.warm_start)
            # As TensorFlow, which says it runs the initializers: results from random weights are rarely wanted.
            logger.warning(
                "No checkpoint in %s and no warm_start_from: evaluating or predicting with freshly "
                "initialised (random) weights.",
                self._model_dir,
            )
            return current
        if current.holds(path):
            return current
        # With only damaged checkpoints (path None) this raises, naming each, instead of using fresh weights.
        checkpoint = self._store.restore(path if checkpoint_path else None, load_optimizer=False)
        return current if current.holds(checkpoint.path) else self.load_checkpoint(module, checkpoint, current)

    def load_checkpoint(self, module: torch.nn.Module, checkpoint: Checkpoint, current: WeightsOrigin) -> WeightsOrigin:
        if self.warm_start is not None and current.source == "init":
            logger.info(
                "model_dir %s has a checkpoint (step %d): it wins over warm_start_from %s, which is not applied.",
                self._model_dir,
                checkpoint.step,
                self.warm_start.ckpt_to_initialize_from,
            )
        load_model_state(module, checkpoint.model_state, checkpoint.path)
        logger.info("Restored weights from %s (global step %d).", checkpoint.path, checkpoint.step)
        weights = WeightsOrigin("checkpoint", checkpoint.step, checkpoint.path)
        if module is self.module:
            self.origin = weights
        return weights

    def apply_warm_start(self, module: torch.nn.Module, settings: WarmStartSettings) -> WeightsOrigin:
        """Warm start on the plain module, all or nothing; model_dir is not touched here."""
        plan = warm_start(module, settings)
        logger.info(
            "model_dir %s has no checkpoint: warm-started %d variables from %s.",
            self._model_dir,
            len(plan.entries),
            settings.ckpt_to_initialize_from,
        )
        weights = WeightsOrigin("warm_start", 0, warm_start_from=str(settings.ckpt_to_initialize_from))
        if module is self.module:
            self.origin = weights
        return weights


def warm_start_checkpoint(settings: WarmStartSettings) -> Checkpoint:
    """The torchestimator checkpoint warm_start_optimizer takes optimizer state from."""
    from torchestimator.interop.torch_sources import TorchestimatorSource

    source = settings.ckpt_to_initialize_from
    if isinstance(source, WeightSource):  # open_weights takes a path
        raise TypeError(
            f"warm_start_optimizer needs the path of a torchestimator checkpoint or model_dir; "
            f"ckpt_to_initialize_from is a {type(source).__name__}."
        )
    with open_weights(source) as weights:
        if not isinstance(weights, TorchestimatorSource):  # the source of format "torchestimator"
            raise ValueError(
                f"warm_start_optimizer needs a torchestimator checkpoint or model_dir; {source} is {weights.format}. "
                "Optimizer state from other formats is not carried over."
            )
        path = weights.checkpoint_path
    return CheckpointStore(filesystems.parent(path)).restore(path)


class GatheredWeights(CheckpointSaverListener):
    """A plain module holding a sharded module's whole weights, as of the last checkpoint (and of now).

    Refreshing is a collective: every replica's Checkpointer calls ``after_save`` at the same step.
    """

    def __init__(self, sharded: torch.nn.Module, plain: torch.nn.Module) -> None:
        self.sharded, self.plain = sharded, plain
        self.refresh()

    def refresh(self) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        self.plain.load_state_dict(get_model_state_dict(self.sharded, options=StateDictOptions(full_state_dict=True)))

    def after_save(self, state: TrainState, global_step: int) -> None:
        self.refresh()
