"""RunConfig rules, the pinned public surface, triggers, logging/summary hooks and the progress bar."""

from __future__ import annotations

import io

import pytest
import torch
from helpers import classifier_model_fn, input_fns, make_estimator

import torchestimator as te
from torchestimator._core.progress import Progress
from torchestimator._io.summary import read_scalars


def test_run_config_defaults_follow_tensorflow():
    config = te.RunConfig()
    assert (config.save_summary_steps, config.save_checkpoints_secs, config.save_checkpoints_steps) == (100, 600, None)
    assert (config.keep_checkpoint_max, config.keep_checkpoint_every_n_hours, config.log_step_count_steps) == (
        5,
        10000,
        100,
    )
    assert config.train_distribute is None and config.eval_distribute is None


def test_checkpoint_intervals_are_exclusive_and_replace_clears_the_other():
    assert te.RunConfig(save_checkpoints_steps=50).save_checkpoints_secs is None
    assert te.RunConfig(save_checkpoints_secs=30).save_checkpoints_steps is None
    disabled = te.RunConfig(save_checkpoints_steps=None, save_checkpoints_secs=None)
    assert disabled.save_checkpoints_steps is None and disabled.save_checkpoints_secs is None
    with pytest.raises(ValueError, match="mutually exclusive"):
        te.RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=10)
    replaced = te.RunConfig().replace(save_checkpoints_steps=10)
    assert (replaced.save_checkpoints_steps, replaced.save_checkpoints_secs) == (10, None)
    with pytest.raises(ValueError, match="unknown fields"):
        te.RunConfig().replace(random_sed=1)  # TF's tf_random_seed is an alias (tests/test_tf_names.py)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"save_summary_steps": -1}, "save_summary_steps must be >= 0"),
        ({"log_step_count_steps": 0}, "log_step_count_steps must be > 0"),
        ({"keep_checkpoint_every_n_hours": 0}, "keep_checkpoint_every_n_hours must be > 0"),
        ({"mixed_precision": "fp8"}, "mixed_precision must be None"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be >= 1"),
        ({"clip_grad_norm": 0.0}, "clip_grad_norm must be > 0"),
        ({"model_dir": ""}, "non-empty"),
    ],
)
def test_run_config_refuses_bad_values(changes, message):
    with pytest.raises((ValueError, TypeError), match=message):
        te.RunConfig(**changes)


def test_run_config_is_frozen():
    with pytest.raises(AttributeError):
        te.RunConfig().save_summary_steps = 5


def test_model_fn_gets_tf_mode_strings_in_each_mode(tmp_path):
    """model_fns written for tf.estimator compare mode to "train" / "eval" / "infer"; those are what arrive."""
    train, evaluate, predict, _ = input_fns(n=32)
    modes = []

    def model_fn(model, features, labels, mode):
        modes.append(mode)
        return classifier_model_fn(model, features, labels, mode)

    estimator = make_estimator(tmp_path, model_fn=model_fn)
    estimator.train(train, max_steps=1)
    estimator.evaluate(evaluate)
    list(estimator.predict(predict))
    assert sorted(set(modes)) == ["eval", "infer", "train"]
    assert modes[0] == te.ModeKeys.TRAIN and modes[-1] == te.ModeKeys.PREDICT
    assert te.ModeKeys.EVAL in modes


def test_every_fires_on_step_multiples_and_once_per_step():
    trigger = te.Every(steps=5)
    trigger.start(3)
    fired = [step for step in range(3, 21) if trigger.should_fire(step) and (trigger.mark(step) or True)]
    assert fired == [5, 10, 15, 20]
    clock = iter([0.0, 0.5, 2.0, 2.0, 2.5])
    timed = te.Every(secs=1.0, clock=lambda: next(clock))
    timed.start(0)
    assert not timed.should_fire(1)
    assert timed.should_fire(2)
    timed.mark(2)
    assert not timed.should_fire(2)
    with pytest.raises(ValueError, match="exactly one"):
        te.Every(steps=1, secs=1)


def test_logging_hooks_write_loss_and_steps_per_second(tmp_path, te_logs):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path, log_step_count_steps=4, save_summary_steps=4)
    estimator.train(train, max_steps=8)
    lines = [r.getMessage() for r in te_logs.records]
    assert any(line.startswith("loss = ") and "step = 8" in line for line in lines)
    assert sum("global_step/sec" in line for line in lines) == 2
    assert [step for step, _ in read_scalars(str(tmp_path))["global_step/sec"]] == [4, 8]


def test_summary_saver_hook_writes_chosen_values(tmp_path):
    train, _, _, _ = input_fns()
    hook = te.SummarySaverHook(save_steps=3, values_fn=lambda ctx: {"custom/double_loss": 2 * ctx.loss})
    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=6, hooks=[hook])
    assert [step for step, _ in read_scalars(str(tmp_path))["custom/double_loss"]] == [3, 6]


def test_logging_tensor_hook_logs_prediction_values(tmp_path, te_logs):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=2, hooks=[te.LoggingTensorHook(["loss", "class"], every_n_iter=2)])
    assert any("class = [" in r.getMessage() for r in te_logs.records)
    with pytest.raises(KeyError, match="nope"):
        estimator.train(train, steps=2, hooks=[te.LoggingTensorHook(["nope"], every_n_iter=1)])


def test_progress_bar_only_when_asked_or_on_a_terminal(monkeypatch, capsys):
    with Progress("train", total=3, enabled=False) as quiet:
        quiet.update(3, loss=0.5)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    with Progress("train", total=3, enabled=None) as auto:
        assert auto._bar is None
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stderr", buffer)
    with Progress("train", total=3, enabled=True) as shown:
        shown.update(3, loss=0.5)
        assert shown._bar.n == 3
    assert "train:" in buffer.getvalue() and "/3" in buffer.getvalue()


def test_fp16_mixed_precision_saves_and_restores_the_grad_scaler(tmp_path, monkeypatch):
    scalers: list[torch.amp.GradScaler] = []

    class GrowingScaler(torch.amp.GradScaler):
        """Changes its scale at every step, so a scaler that started fresh after resume would differ."""

        def __init__(self, device: str) -> None:
            super().__init__(device, growth_interval=1)
            scalers.append(self)

    monkeypatch.setattr(torch.amp, "GradScaler", GrowingScaler)
    train, _, _, _ = input_fns()
    make_estimator(tmp_path / "straight", mixed_precision="fp16", save_checkpoints_steps=5).train(train, max_steps=8)
    straight_scale = scalers[-1].get_scale()
    make_estimator(tmp_path / "resumed", mixed_precision="fp16", save_checkpoints_steps=5).train(train, max_steps=5)
    saved_scale = scalers[-1].get_scale()
    make_estimator(tmp_path / "resumed", mixed_precision="fp16", save_checkpoints_steps=5).train(train, max_steps=8)
    assert saved_scale != 65536.0  # it moved in the first 5 steps
    assert scalers[-1].get_scale() == straight_scale
    assert scalers[-1].state_dict() == scalers[0].state_dict()
