"""The evaluator task, TensorFlow's way: the files it shares with the trainers (stop signal, training run,
the step under evaluation), its decisions (best, early stopping, the final evaluation, bounded waits), the
trainers' side (stop at the signal, keep what the evaluator needs), and TF_CONFIG chief + worker + evaluator
as three plain `python script.py` processes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch.nn.functional as F
from helpers import input_fns, make_classification, make_estimator

import torchestimator as te
from torchestimator._io import filesystems
from torchestimator._io.summary import read_scalars
from torchestimator._policy import trainer_task
from torchestimator._policy.best import BEST_FILE, BestCheckpointPolicy, read_best
from torchestimator._policy.early_stopping import EarlyStopping, stop_if_higher_hook
from torchestimator._policy.evaluator_channel import (
    END_EARLY_STOPPING,
    END_MAX_STEPS,
    EVALUATING_STEP_MAX_AGE_SECS,
    EVALUATOR_FILE,
    STOP_SIGNAL_FILE,
    TRAINING_RUN_FILE,
    StopSignal,
    StopSignalWatch,
    TrainingRun,
    read_evaluating_step,
    read_stop_signal,
    read_training_run,
    write_evaluating_step,
    write_stop_signal,
    write_training_run,
)
from torchestimator._policy.train_and_evaluate import EvalSpec, TrainSpec, run_evaluator, train_and_evaluate
from torchestimator._policy.trainer_task import EvaluatorRecordsKeeper, train_for_evaluator
from torchestimator.distribute.launcher import find_free_port
from torchestimator.errors import ConfigError


def scored_model_fn(model, features, labels, mode):
    """A classifier whose `score` metric is the eval input's constant `score` column (a metric tests control)."""
    logits = model(features["x"])
    predictions = {"class": logits.argmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    metrics = {"score": te.metrics.mean(features["score"])} if "score" in features else {}
    return te.EstimatorSpec(
        mode, predictions=predictions, loss=F.cross_entropy(logits, labels), eval_metric_ops=metrics
    )


def scored_eval_input(score=0.5, n=64):
    x, y = make_classification(n, seed=1)
    return te.numpy_input_fn(
        {"x": x, "score": np.full(n, score, np.float32)}, y, batch_size=32, num_epochs=1, shuffle=False
    )


def estimator(model_dir, **config):
    return make_estimator(model_dir, model_fn=scored_model_fn, **{"keep_checkpoint_max": None, **config})


class FakeExporter:
    """The Exporter interface, recording (step, final) of each call."""

    def __init__(self):
        self.name, self.calls = "fake", []

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        self.calls.append((eval_result["global_step"], is_the_final_export))
        return checkpoint_path


def eval_steps(model_dir):
    return [step for step, _ in read_scalars(filesystems.join(os.fspath(model_dir), "eval")).get("loss", [])]


class SimulatedTrainers:
    """Stands in for the training chief, driven by the evaluator's sleeps (one thread, no races).

    At each sleep: trains ``steps`` more steps as run ``run_ids[0]`` (training_run.json kept as the chief
    keeps it); once a stop signal addressed to the current run appears, trains ``steps`` more (trainers
    notice it a little later) and ends there, or restarts as the next run id if there is one (a crash and
    an elastic restart). ``start_after`` sleeps pass before the first run starts; with ``end_at`` the run
    ends (its input ran out) at the sleep after it reached that step. With ``records=False`` they are
    plain trainers: no training_run.json, no ear for a stop signal.
    """

    def __init__(
        self,
        model_dir,
        *,
        run_ids=("run-1",),
        steps=10,
        start_after=0,
        end_at=None,
        ends=True,
        records=True,
        end_cause=None,
    ):
        self.model_dir, self.run_ids, self.steps, self.end_at, self.ends = model_dir, list(run_ids), steps, end_at, ends
        self.end_cause = end_cause
        self.records = records  # False: plain trainers (`torchestimator train`): no training_run.json, deaf to signals
        self.trainer = estimator(model_dir)
        self.train, _, _, _ = input_fns()
        self.step, self.run_id, self.ended, self.waits = 0, None, False, start_after
        self.signals: list[StopSignal | None] = []

    def __call__(self, seconds):
        # Bounds for a broken evaluator: one that never stops them, or never stops following them.
        assert self.step < 300 and len(self.signals) < 500, "the evaluator did not end (see SimulatedTrainers)"
        self.signals.append(read_stop_signal(self.model_dir))
        if self.ended:
            return
        if self.waits:
            self.waits -= 1
            return
        if self.run_id is None:
            self._start(self.run_ids.pop(0))
        if self.end_at is not None and self.step >= self.end_at:  # the input ended at the previous sleep
            self._end()
            return
        signal = self.signals[-1]
        told = self.records and signal is not None and signal.run_id == self.run_id
        self.step += self.steps
        self.trainer.train(self.train, max_steps=self.step)
        if told and self.run_ids:
            self._start(self.run_ids.pop(0))
        elif told and self.ends:
            self._end()

    def _end(self):
        self.ended = True
        if self.records:
            write_training_run(
                self.model_dir,
                TrainingRun(
                    run_id=self.run_id,
                    evaluator_task=True,
                    start_step=0,
                    end_step=self.step,
                    end_reason="test",
                    end_cause=self.end_cause,
                ),
            )

    def _start(self, run_id):
        self.run_id = run_id
        if self.records:
            write_training_run(self.model_dir, TrainingRun(run_id=run_id, evaluator_task=True, start_step=self.step))


def follow(model_dir, trainers, *, rules=(), best=None, exporter=None, max_steps=None, **options):
    exporter = exporter or FakeExporter()
    results, _ = run_evaluator(
        estimator(model_dir),
        TrainSpec(trainers.train, max_steps=max_steps),
        EvalSpec(scored_eval_input(), start_delay_secs=0, exporters=exporter),
        best=best,
        early_stopping=rules,
        poll_secs=0,
        sleep=trainers,
        **options,
    )
    return results, exporter


# -- the files ---------------------------------------------------------------------------------


def test_the_three_documents_round_trip(tmp_path):
    model_dir = str(tmp_path)
    assert read_training_run(model_dir) is None and read_stop_signal(model_dir) is None
    run = TrainingRun(run_id="abc", evaluator_task=True, start_step=20, end_step=40, end_reason="max_steps 40 reached")
    write_training_run(model_dir, run)
    write_stop_signal(model_dir, StopSignal(run_id="abc", step=30, rule="stop_if_higher('score', 0.4)"))
    write_evaluating_step(model_dir, 30)
    assert read_training_run(model_dir) == run and read_training_run(model_dir).ended
    assert read_stop_signal(model_dir) == StopSignal(run_id="abc", step=30, rule="stop_if_higher('score', 0.4)")
    assert read_evaluating_step(model_dir) == 30
    write_evaluating_step(model_dir, None)
    assert read_evaluating_step(model_dir) is None
    assert not [name for name in os.listdir(model_dir) if ".tmp-" in name]  # written atomically, nothing left over


@pytest.mark.parametrize(
    "content, complaint",
    [
        (b"{not json", "unreadable"),
        (b'{"format_version": 7, "run_id": "a", "step": 1, "rule": "r"}', "not a format 1 document"),
        (b'{"format_version": 1, "run_id": "a", "step": -1, "rule": "r"}', "field 'step' must be int"),
        (b'{"format_version": 1, "run_id": "a", "step": true, "rule": "r"}', "field 'step' must be int"),
        (b'{"format_version": 1, "run_id": 5, "step": 1, "rule": "r"}', "field 'run_id' must be str"),
        (b" " * (65 * 1024), "unreadable"),
    ],
)
def test_a_damaged_stop_signal_is_ignored_with_a_warning_naming_it(tmp_path, caplog, content, complaint):
    (tmp_path / STOP_SIGNAL_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert read_stop_signal(str(tmp_path)) is None
    assert STOP_SIGNAL_FILE in caplog.text and complaint in caplog.text


def test_a_fifo_in_place_of_a_signal_does_not_block_the_trainers(tmp_path, caplog):
    os.mkfifo(tmp_path / STOP_SIGNAL_FILE)
    with caplog.at_level(logging.WARNING):
        assert read_stop_signal(str(tmp_path)) is None  # returns at once: no writer is waited for
    assert "not a regular file" in caplog.text


def test_the_watch_stats_at_most_every_poll_secs_and_obeys_only_its_own_run(tmp_path, monkeypatch, caplog):
    model_dir, now = str(tmp_path), [0.0]
    reads = []
    import torchestimator._policy.evaluator_channel as channel

    real_read = channel.read_stop_signal
    monkeypatch.setattr(channel, "read_stop_signal", lambda folder: reads.append(folder) or real_read(folder))
    watch = StopSignalWatch(model_dir, "this-run", poll_secs=5, clock=lambda: now[0])
    assert watch.check() is None  # first poll: no file
    write_stop_signal(model_dir, StopSignal(run_id="earlier-run", step=10, rule="r"))
    now[0] = 4.0
    assert watch.check() is None and reads == []  # within poll_secs of the last poll: not even a stat
    now[0] = 5.0
    with caplog.at_level(logging.INFO):
        assert watch.check() is None and len(reads) == 1  # an earlier run's signal: read once, ignored
    assert "earlier-run" in caplog.text and "ignored" in caplog.text
    now[0] = 10.0
    assert watch.check() is None and len(reads) == 1  # unchanged file: a stat, no read
    write_stop_signal(model_dir, StopSignal(run_id="this-run", step=20, rule="r"))
    now[0] = 15.0
    assert watch.check() == StopSignal(run_id="this-run", step=20, rule="r") and len(reads) == 2
    assert watch.check() is watch.signal  # once found, kept


# -- the evaluator's decisions -------------------------------------------------------------------


def test_early_stopping_signals_the_run_then_evaluates_its_final_checkpoint(tmp_path):
    trainers = SimulatedTrainers(str(tmp_path))
    # A constant score never improves: patience 2 stops at the third evaluation (steps 10, 20, 30).
    results, exporter = follow(tmp_path, trainers, rules=[EarlyStopping("score", mode="max", patience=2)])
    assert read_stop_signal(str(tmp_path)) == StopSignal(
        run_id="run-1", step=30, rule="EarlyStopping('score', mode='max', patience=2, min_delta=0.0)"
    )
    # The trainers ended at 40, after the signal: the evaluator evaluated that checkpoint, as the final one.
    assert results["global_step"] == 40 and eval_steps(tmp_path) == [10, 20, 30, 40]
    assert exporter.calls == [(10, False), (20, False), (30, False), (40, True)]


def test_an_evaluator_restarted_after_the_trainers_ended_finishes_their_run_at_once(tmp_path):
    model_dir = str(tmp_path)
    estimator(model_dir).train(input_fns()[0], max_steps=10)  # a job stopped by its evaluator, killed before the end
    write_training_run(
        model_dir,
        TrainingRun(
            run_id="done", evaluator_task=True, start_step=0, end_step=10, end_reason="stopped by the evaluator"
        ),
    )
    write_stop_signal(model_dir, StopSignal(run_id="done", step=10, rule="a rule"))
    trainers = SimulatedTrainers(model_dir, start_after=10**9)  # nobody trains any more
    results, exporter = follow(tmp_path, trainers, rules=[stop_if_higher_hook("score", 0.4)])
    # The run's final checkpoint, evaluated and exported as final, then returned: no wait for an answer.
    assert results["global_step"] == 10 and exporter.calls == [(10, True)] and len(trainers.signals) <= 1
    assert read_stop_signal(model_dir) == StopSignal(run_id="done", step=10, rule="a rule")


def an_earlier_job(model_dir, *, cause, rules=(), end_at=None, max_steps=None):
    """A whole job that ran to its end beside its evaluator (eval/ has its checkpoints), recorded as ended by
    ``cause``; returns the step it ended at."""
    trainers = SimulatedTrainers(model_dir, run_ids=("earlier-job",), end_at=end_at)
    follow(model_dir, trainers, rules=rules)
    write_training_run(
        model_dir,
        TrainingRun(
            run_id="earlier-job",
            evaluator_task=True,
            start_step=0,
            end_step=trainers.step,
            end_reason="the earlier job's end",
            max_steps=max_steps,
            end_cause=cause,
        ),
    )
    return trainers.step


# Started after the trainers (their new run is recorded before the evaluator first looks), with them (it sees the
# earlier job's record first), or well before them.
EVALUATOR_STARTS = pytest.mark.parametrize("start_after", [0, 1, 4], ids=["after", "with", "before"])


@EVALUATOR_STARTS
def test_a_job_restarted_with_a_higher_max_steps_is_followed_to_its_new_end(tmp_path, start_after):
    model_dir = str(tmp_path)
    assert an_earlier_job(model_dir, cause=END_MAX_STEPS, end_at=20, max_steps=20) == 20
    rerun = SimulatedTrainers(
        model_dir, run_ids=("rerun",), start_after=start_after, end_at=40, end_cause=END_MAX_STEPS
    )
    rerun.step = 20
    results, exporter = follow(model_dir, rerun, max_steps=40)
    # The earlier job's end at 20 is not this evaluator's: it followed the rerun to max_steps 40, and did not
    # evaluate 20 again (eval/ had it).
    assert results["global_step"] == 40 and exporter.calls == [(30, False), (40, True)]
    assert eval_steps(model_dir) == [10, 20, 30, 40]


@EVALUATOR_STARTS
def test_a_rerun_with_relaxed_early_stopping_is_followed(tmp_path, start_after):
    model_dir = str(tmp_path)
    stop_at = an_earlier_job(
        model_dir, cause=END_EARLY_STOPPING, rules=[EarlyStopping("score", mode="max", patience=2)]
    )
    assert stop_at == 40  # the signal at 30, the trainers' answer at 40
    rerun = SimulatedTrainers(model_dir, run_ids=("rerun",), start_after=start_after, end_at=60)
    rerun.step = stop_at
    results, exporter = follow(model_dir, rerun, rules=[EarlyStopping("score", mode="max", patience=10)], max_steps=60)
    assert results["global_step"] == 60 and exporter.calls == [(50, False), (60, True)]


@EVALUATOR_STARTS
def test_a_rerun_after_early_stopping_with_the_same_rules_ends_the_evaluator_at_once(tmp_path, start_after):
    model_dir = str(tmp_path)
    rules = lambda: [EarlyStopping("score", mode="max", patience=2)]  # noqa: E731  (fresh state each job)
    stop_at = an_earlier_job(model_dir, cause=END_EARLY_STOPPING, rules=rules())
    # The trainers' rerun takes no step (its chief asks the same rules first): they only record a new run.
    rerun = SimulatedTrainers(
        model_dir, run_ids=("rerun",), start_after=start_after, end_at=stop_at, end_cause=END_EARLY_STOPPING
    )
    rerun.step = stop_at
    results, exporter = follow(model_dir, rerun, rules=rules(), max_steps=1000)
    assert results["global_step"] == stop_at and exporter.calls == [(stop_at, True)] and len(rerun.signals) <= 3
    assert estimator(model_dir).latest_checkpoint().endswith(f"ckpt-{stop_at}")


def test_the_evaluator_says_what_it_waits_for_at_start(tmp_path, caplog):
    model_dir = str(tmp_path)
    an_earlier_job(model_dir, cause=END_MAX_STEPS, end_at=20, max_steps=20)
    rerun = SimulatedTrainers(model_dir, run_ids=("rerun",), start_after=1, end_at=30)
    rerun.step = 20
    with caplog.at_level(logging.INFO, logger="torchestimator"):
        run_evaluator(
            estimator(model_dir),
            TrainSpec(rerun.train, max_steps=30),
            EvalSpec(scored_eval_input(), start_delay_secs=7, throttle_secs=3),
            sleep=rerun,
        )
    assert "waits start_delay_secs=7 s" in caplog.text and "then every 3 s" in caplog.text
    assert "ended at global step 20 (the earlier job's end)" in caplog.text
    assert "Waiting for the trainers' next run" in caplog.text


def test_a_chief_beside_an_evaluator_takes_no_step_when_eval_already_says_stop(tmp_path, monkeypatch):
    model_dir = str(tmp_path)
    stop_at = an_earlier_job(
        model_dir, cause=END_EARLY_STOPPING, rules=[EarlyStopping("score", mode="max", patience=2)]
    )
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"chief": ["127.0.0.1:2222"], "evaluator": ["127.0.0.1:2223"]},
                "task": {"type": "chief", "index": 0},
            }
        ),
    )
    train, _, _, _ = input_fns()
    answer = train_and_evaluate(
        estimator(model_dir),
        TrainSpec(train, max_steps=1000),
        EvalSpec(scored_eval_input()),
        early_stopping=EarlyStopping("score", mode="max", patience=2),
    )
    assert answer == (None, None) and estimator(model_dir).latest_checkpoint().endswith(f"ckpt-{stop_at}")
    run = read_training_run(model_dir)
    assert run.run_id != "earlier-job" and (run.start_step, run.end_step) == (stop_at, stop_at)
    assert run.end_cause == END_EARLY_STOPPING and run.end_reason.startswith("took no step: early stopping")
    assert run.max_steps == 1000
    # With rules that now let it go on, the same chief trains, and its record says why it ended.
    train_and_evaluate(
        estimator(model_dir),
        TrainSpec(train, max_steps=60),
        EvalSpec(scored_eval_input()),
        early_stopping=EarlyStopping("score", mode="max", patience=10),
    )
    run = read_training_run(model_dir)
    assert (run.start_step, run.end_step, run.end_cause) == (stop_at, 60, END_MAX_STEPS)


def test_a_training_run_with_an_unknown_end_cause_is_ignored_naming_it(tmp_path, caplog):
    model_dir = str(tmp_path)
    write_training_run(
        model_dir, TrainingRun(run_id="r", evaluator_task=True, start_step=0, end_step=5, end_cause="a cosmic ray")
    )
    with caplog.at_level(logging.WARNING):
        assert read_training_run(model_dir) is None
    assert "end_cause" in caplog.text and "a cosmic ray" in caplog.text and TRAINING_RUN_FILE in caplog.text


def test_a_decision_reaching_no_run_is_given_to_the_run_that_starts_later(tmp_path, caplog):
    model_dir = str(tmp_path)
    estimator(model_dir).train(input_fns()[0], max_steps=10)  # an earlier job, stopped early by its evaluator...
    write_training_run(
        model_dir,
        TrainingRun(
            run_id="old", evaluator_task=True, start_step=0, end_step=10, end_reason="stopped by the evaluator"
        ),
    )
    write_stop_signal(model_dir, StopSignal(run_id="old", step=10, rule="old rule"))
    estimator(model_dir).train(input_fns()[0], max_steps=20)  # ...then trained on by a plain `train`
    trainers = SimulatedTrainers(model_dir, run_ids=("new",), start_after=2)
    trainers.step = 20
    with caplog.at_level(logging.WARNING):
        results, exporter = follow(tmp_path, trainers, rules=[stop_if_higher_hook("score", 0.4)])
    # The old run ended at 10, before the newest checkpoint: an earlier job's, whose end does not end this one.
    # The rule fired at the first evaluation (20), before the new run existed: the old signal stayed as it was
    # until the new run started, and then the decision was addressed to it.
    assert [signal.run_id for signal in trainers.signals[:3]] == ["old", "old", "old"]
    assert read_stop_signal(model_dir).run_id == "new" and read_stop_signal(model_dir).step == 20
    assert results["global_step"] == trainers.step == 40 and exporter.calls[-1] == (40, True)
    assert caplog.text.count("no training run in") == 1 and "reaches no one" not in caplog.text


def test_beside_plain_trainers_the_evaluator_says_so_once_and_evaluates_up_to_max_steps(tmp_path, caplog):
    trainers = SimulatedTrainers(str(tmp_path), records=False)  # `torchestimator train FILE`: no run record
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        _results, exporter = follow(tmp_path, trainers, rules=[stop_if_higher_hook("score", 0.4)], max_steps=40)
    # The rule said stop at 10, but nobody listens: no signal written, no wait for an answer (stop_timeout_secs is
    # 600), every checkpoint evaluated up to max_steps.
    assert time.monotonic() - started < 60 and not os.path.exists(tmp_path / STOP_SIGNAL_FILE)
    assert eval_steps(tmp_path) == [10, 20, 30, 40] and exporter.calls[-1] == (40, True)
    warning = [record.getMessage() for record in caplog.records if "listens to this evaluator" in record.getMessage()]
    assert len(warning) == 1 and "train_and_evaluate" in warning[0] and '"evaluator": ["host:port"]' in warning[0]
    assert "no training run listens" in caplog.text  # the decision says it reached no one


def test_an_evaluator_refuses_trainers_in_local_mode(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    train, _, _, _ = input_fns()
    train_and_evaluate(
        estimator(tmp_path), TrainSpec(train, max_steps=10), EvalSpec(scored_eval_input(), throttle_secs=0)
    )
    run = read_training_run(str(tmp_path))
    assert run.evaluator_task is False and run.end_step == 10  # local mode records that it evaluates itself
    with pytest.raises(ConfigError, match="train_and_evaluate without TF_CONFIG"):
        follow(tmp_path, SimulatedTrainers(str(tmp_path), start_after=10**9))
    assert eval_steps(tmp_path) == [10]  # the trainer's evaluation only


def test_an_evaluator_with_tf1_layout_refuses_at_start_up(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]},
                "task": {"type": "evaluator", "index": 0},
            }
        ),
    )
    from torchestimator._policy import train_and_evaluate as module

    def follows(*args, **kwargs):
        raise AssertionError("the evaluator started following model_dir instead of refusing")

    monkeypatch.setattr(module, "run_evaluator", follows)
    train, _, _, _ = input_fns()
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"lists no 'evaluator' job.*\"evaluator\": \[\"host:port\"\].*every task"):
        train_and_evaluate(estimator(tmp_path), TrainSpec(train, max_steps=10), EvalSpec(scored_eval_input()))
    assert time.monotonic() - started < 5 and not os.path.exists(tmp_path / "eval")


def test_the_step_stays_protected_while_its_exporters_run_and_a_vanished_one_is_skipped(tmp_path, caplog):
    model_dir = str(tmp_path)

    class DeletesUnderItself(FakeExporter):
        """Sees evaluator.json during export; at step 10 plays the chief's retention and then fails as a loader would."""

        def __init__(self):
            super().__init__()
            self.protected = []

        def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
            self.protected.append(read_evaluating_step(model_dir))
            if eval_result["global_step"] == 10:
                shutil.rmtree(checkpoint_path)
                raise ValueError(f"Couldn't find trained model at {checkpoint_path}")
            return super().export(estimator, export_path, checkpoint_path, eval_result, is_the_final_export)

    exporter = DeletesUnderItself()
    with caplog.at_level(logging.WARNING):
        results, _ = follow(tmp_path, SimulatedTrainers(model_dir, end_at=20), exporter=exporter)
    # Protected while exported, 10 and 20; the re-export of 20 as final comes after the run ended (no saves left).
    assert exporter.protected == [10, 20, None] and read_evaluating_step(model_dir) is None
    assert "Skipped the exports of" in caplog.text and "ckpt-10" in caplog.text
    assert results["global_step"] == 20 and exporter.calls == [(20, False), (20, True)]


def test_a_stale_evaluator_file_protects_nothing(tmp_path):
    from torchestimator._io import atomic

    model_dir = str(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def written_by(pid):
        write_evaluating_step(model_dir, 30)
        document = json.loads((tmp_path / EVALUATOR_FILE).read_text())
        (tmp_path / EVALUATOR_FILE).write_text(json.dumps({**document, "writer": f"{pid}-h{atomic._HOST}"}))

    written_by(dead.pid)  # an evaluator killed mid-evaluation
    assert read_evaluating_step(model_dir) is None
    written_by(os.getppid())  # a live evaluator on this host
    assert read_evaluating_step(model_dir) == 30
    assert read_evaluating_step(model_dir, now=lambda: time.time() + EVALUATING_STEP_MAX_AGE_SECS + 60) is None
    write_evaluating_step(model_dir, 30)  # this process, evaluator and chief in one: alive
    assert read_evaluating_step(model_dir) == 30


def test_a_decision_is_readdressed_when_the_trainers_restart_as_a_new_run(tmp_path):
    trainers = SimulatedTrainers(str(tmp_path), run_ids=("first", "after-restart"))
    results, _ = follow(tmp_path, trainers, rules=[stop_if_higher_hook("score", 0.4)])
    addressed = [signal.run_id for signal in trainers.signals if signal is not None]
    assert addressed[0] == "first" and addressed[-1] == "after-restart"
    assert read_training_run(str(tmp_path)).run_id == "after-restart" and results["global_step"] == trainers.step


def test_trainers_that_do_not_answer_leave_the_evaluator_after_stop_timeout_secs(tmp_path, caplog):
    trainers = SimulatedTrainers(str(tmp_path), ends=False)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        results, exporter = follow(tmp_path, trainers, rules=[stop_if_higher_hook("score", 0.4)], stop_timeout_secs=0)
    assert time.monotonic() - started < 60
    assert "did not end their run within 0 s" in caplog.text
    # The newest checkpoint, evaluated as the final one.
    assert exporter.calls[-1] == (results["global_step"], True) and results["global_step"] == trainers.step


def test_without_max_steps_the_evaluator_ends_with_training(tmp_path):
    """TensorFlow's evaluator waited forever when max_steps was None; here the chief's end record ends it."""
    trainers = SimulatedTrainers(str(tmp_path), end_at=20)
    results, exporter = follow(tmp_path, trainers)
    assert results["global_step"] == 20 and eval_steps(tmp_path) == [10, 20]  # 20 evaluated once...
    assert exporter.calls == [(10, False), (20, False), (20, True)]  # ...and exported again as the final one


def test_an_evaluator_refuses_trainers_that_evaluate_themselves(tmp_path):
    estimator(tmp_path).train(input_fns()[0], max_steps=10)
    write_training_run(str(tmp_path), TrainingRun(run_id="r", evaluator_task=False, start_step=0))
    with pytest.raises(ConfigError, match=r"lists no 'evaluator' job.*\"evaluator\": \[\"host:port\"\]"):
        follow(tmp_path, SimulatedTrainers(str(tmp_path), start_after=10**9))  # the record above stays


def test_the_evaluator_records_the_best_in_best_json_and_names_the_step_it_evaluates(tmp_path):
    model_dir = str(tmp_path)
    seen_during_evaluation = []

    class ReadsEvaluatorFile(te.Hook):
        def begin(self, state):
            seen_during_evaluation.append(read_evaluating_step(model_dir))

    def manifest_is_the_chiefs(steps):
        raise AssertionError(f"the evaluator marked {steps} in the manifest, which has one writer: the chief")

    trainers = SimulatedTrainers(model_dir, end_at=30)
    evaluating = estimator(model_dir)
    evaluating.checkpoint_store.mark_best = manifest_is_the_chiefs
    run_evaluator(
        evaluating,
        TrainSpec(trainers.train),
        EvalSpec(scored_eval_input(), start_delay_secs=0, hooks=[ReadsEvaluatorFile()]),
        best=BestCheckpointPolicy("loss", keep=2),
        poll_secs=0,
        sleep=trainers,
    )
    assert seen_during_evaluation == [10, 20, 30] and read_evaluating_step(model_dir) is None
    losses = {
        step: values["loss"]
        for step, values in (
            (step, dict(loss=value)) for step, value in read_scalars(os.path.join(model_dir, "eval"))["loss"]
        )
    }
    assert [record.step for record in read_best(model_dir)] == sorted(losses, key=losses.get)[:2]


def test_the_chief_keeps_the_recorded_best_and_the_step_under_evaluation_from_retention(tmp_path):
    model_dir = str(tmp_path)
    train, _, _, _ = input_fns()
    estimator(model_dir).train(train, max_steps=20)  # ckpt-10 and ckpt-20
    trainer = estimator(model_dir, keep_checkpoint_max=1)
    store = trainer.checkpoint_store
    BestCheckpointPolicy("loss").update_record(store, 10, {"loss": 0.1, "global_step": 10})  # the evaluator's
    write_evaluating_step(model_dir, 20)
    keeper = EvaluatorRecordsKeeper(store)
    trainer.train(train, max_steps=40, saving_listeners=[keeper])
    assert [entry["step"] for entry in store.history()] == [10, 20, 40] and store.manifest["best"] == [10]
    # The evaluation of 20 is done and 40 is the new best: at the next save 10 and 20 are released.
    BestCheckpointPolicy("loss").update_record(store, 40, {"loss": 0.01, "global_step": 40})
    write_evaluating_step(model_dir, None)
    trainer.train(train, max_steps=50, saving_listeners=[keeper])
    assert [entry["step"] for entry in store.history()] == [40, 50] and store.manifest["best"] == [40]
    keeper.release()
    assert store.protected == frozenset()


# -- the trainers ---------------------------------------------------------------------------------


class SignalsAtStep(te.Hook):
    """Plays the evaluator: at ``step`` it writes a stop signal addressed to the run the chief recorded."""

    def __init__(self, model_dir, step):
        self.model_dir, self.step = model_dir, step

    def after_step(self, run_context):
        if run_context.global_step == self.step:
            run_id = read_training_run(self.model_dir).run_id
            write_stop_signal(self.model_dir, StopSignal(run_id=run_id, step=self.step - 2, rule="a rule"))


def test_a_chief_beside_an_evaluator_trains_only_and_stops_at_its_runs_signal(tmp_path, monkeypatch):
    model_dir = str(tmp_path)
    write_stop_signal(model_dir, StopSignal(run_id="an-earlier-run", step=1, rule="stale"))  # must not stop it
    monkeypatch.setattr(trainer_task, "STOP_POLL_SECS", 0)  # a stat after every step: these steps take microseconds
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"chief": ["127.0.0.1:2222"], "evaluator": ["127.0.0.1:2223"]},
                "task": {"type": "chief", "index": 0},
            }
        ),
    )
    train, _, _, _ = input_fns()
    exporter = FakeExporter()
    answer = train_and_evaluate(
        estimator(model_dir),
        TrainSpec(train, max_steps=100, hooks=[SignalsAtStep(model_dir, 7)]),
        EvalSpec(scored_eval_input(), exporters=exporter),
        early_stopping=stop_if_higher_hook("score", 0.4),
        best=BestCheckpointPolicy(),
    )
    assert answer == (None, None)
    assert estimator(model_dir).latest_checkpoint().endswith("ckpt-7")  # the final checkpoint, at the stop
    run = read_training_run(model_dir)
    assert run.evaluator_task and run.end_step == 7 and "a rule at global step 5" in run.end_reason
    assert not os.path.exists(os.path.join(model_dir, "eval")) and exporter.calls == []
    assert not os.path.exists(os.path.join(model_dir, BEST_FILE))


def test_trainers_beside_an_evaluator_need_checkpoints(tmp_path):
    train, _, _, _ = input_fns()
    with pytest.raises(ConfigError, match="checkpoints are disabled"):
        train_for_evaluator(
            estimator(tmp_path, save_checkpoints_steps=None), TrainSpec(train, max_steps=5), is_chief=False
        )


def test_a_chief_without_an_evaluator_job_evaluates_and_records_it_for_a_stray_evaluator(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": {"chief": ["127.0.0.1:2222"]}, "task": {"type": "chief", "index": 0}})
    )
    train, _, _, _ = input_fns()
    results, _ = train_and_evaluate(
        estimator(tmp_path), TrainSpec(train, max_steps=10), EvalSpec(scored_eval_input(), throttle_secs=0)
    )
    assert results["global_step"] == 10 and eval_steps(tmp_path) == [10]
    run = read_training_run(str(tmp_path))
    assert run.evaluator_task is False and run.end_step == 10


def test_a_training_run_already_at_max_steps_still_records_its_end(tmp_path, monkeypatch):
    train, _, _, _ = input_fns()
    estimator(tmp_path).train(train, max_steps=10)
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"chief": ["127.0.0.1:2222"], "evaluator": ["127.0.0.1:2223"]},
                "task": {"type": "chief", "index": 0},
            }
        ),
    )
    train_and_evaluate(estimator(tmp_path), TrainSpec(train, max_steps=10), EvalSpec(scored_eval_input()))
    run = read_training_run(str(tmp_path))
    assert run.end_step == 10 and run.end_reason == "max_steps 10 reached"


# -- three plain processes --------------------------------------------------------------------------

_SCRIPT = textwrap.dedent('''
    """A TF user's launch script, run unchanged by every task: the task comes from TF_CONFIG."""
    import json, os, sys
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    model_dir, out = sys.argv[1], sys.argv[2]
    max_steps, patience = (int(value) for value in (sys.argv[3:5] or (1_000_000, 2)))
    task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]

    centers = np.random.default_rng(0).normal(0, 3, size=(3, 8))

    def data(n, seed):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 3, size=n)
        return (centers[y] + rng.normal(0, 1, size=(n, 8))).astype(np.float32), y.astype(np.int64)

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)})
        metrics = {"score": te.metrics.mean(features["score"])} if "score" in features else {}
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels), eval_metric_ops=metrics)

    x, y = data(512, 0)
    ex, ey = data(64, 1)
    train_input = te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=0)
    eval_input = te.numpy_input_fn({"x": ex, "score": np.full(64, 0.5, np.float32)}, ey, batch_size=32,
                                   num_epochs=1, shuffle=False)

    class RecordingExporter:
        name = "recording"
        def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
            # Beside the task's json, not under export_path: model_dir may be in an object store.
            with open(os.path.join(os.path.dirname(out), "calls.jsonl"), "a") as calls:
                calls.write(json.dumps({"task": task, "pid": os.getpid(), "step": eval_result["global_step"],
                                        "final": is_the_final_export}) + "\\n")
            return checkpoint_path

    class LastStep(te.Hook):
        def end(self, state):
            self.step = state.global_step

    last = LastStep()
    config = te.RunConfig(train_distribute=te.MirroredStrategy(), save_checkpoints_steps=5, keep_checkpoint_max=3,
                          log_step_count_steps=None, progress_bar=False, random_seed=0)
    estimator = te.Estimator(model_fn=model_fn, model=lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                             nn.Linear(16, 3)), optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
                             model_dir=model_dir, config=config)
    answer = te.train_and_evaluate(
        estimator, te.TrainSpec(train_input, max_steps=max_steps, hooks=[last]),
        te.EvalSpec(eval_input, steps=None, start_delay_secs=0, throttle_secs=0, exporters=[RecordingExporter()]),
        # A constant score never improves: the first evaluation stays the best (ties keep the earlier step), and
        # patience 2 stops training at the third.
        best=te.BestCheckpointPolicy("score", higher_is_better=True),
        early_stopping=te.EarlyStopping("score", mode="max", patience=patience))
    results = answer[0]
    with open(out, "w") as handle:
        json.dump({"task": task, "pid": os.getpid(), "final_step": getattr(last, "step", None),
                   "evaluated_step": None if results is None else results["global_step"]}, handle)
''')


def _start(script, model_dir, out, tf_config, tmp_path, arguments=()):
    env = {
        **os.environ,
        "TF_CONFIG": json.dumps(tf_config),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TORCHESTIMATOR_COLLECTIVE_TIMEOUT": "60",
    }
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    log = open(tmp_path / f"{tf_config['task']['type']}.log", "wb")
    return subprocess.Popen(
        [sys.executable, str(script), model_dir, str(out), *map(str, arguments)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(tmp_path),
    ), log


TASKS = [("chief", 0), ("worker", 0), ("evaluator", 0)]


def run_job(tmp_path, model_dir, arguments=()):
    """Chief, worker and evaluator of one job, started together on fresh ports; what each wrote to its json."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    cluster = {
        "chief": [f"127.0.0.1:{find_free_port()}"],
        "worker": [f"127.0.0.1:{find_free_port()}"],
        "evaluator": [f"127.0.0.1:{find_free_port()}"],
    }
    for kind, _ in TASKS:
        (tmp_path / f"{kind}.json").unlink(missing_ok=True)
    processes = [
        _start(
            script,
            model_dir,
            tmp_path / f"{kind}.json",
            {"cluster": cluster, "task": {"type": kind, "index": index}},
            tmp_path,
            arguments,
        )
        for kind, index in TASKS
    ]
    deadline = time.monotonic() + 150
    try:
        for process, _ in processes:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
            log.close()
    logs = {kind: (tmp_path / f"{kind}.log").read_text(errors="replace")[-3000:] for kind, _ in TASKS}
    codes = {kind: process.returncode for (kind, _), (process, _) in zip(TASKS, processes)}
    assert codes == {"chief": 0, "worker": 0, "evaluator": 0}, (codes, logs)
    return [json.loads((tmp_path / f"{kind}.json").read_text()) for kind, _ in TASKS]


@pytest.mark.slow
@pytest.mark.distributed
def test_chief_worker_and_evaluator_as_three_plain_processes(tmp_path):
    model_dir = str(tmp_path / "model")
    chief, worker, evaluator = run_job(tmp_path, model_dir)
    # The trainers stopped together, early (max_steps was a million), at the evaluator's word.
    signal = read_stop_signal(model_dir)
    assert chief["final_step"] == worker["final_step"] < 1_000_000 and signal.step <= chief["final_step"]
    run = read_training_run(model_dir)
    assert run.run_id == signal.run_id and run.end_step == chief["final_step"] and "EarlyStopping" in run.end_reason
    # The evaluator evaluated the final checkpoint, then exited; it alone wrote eval/ and ran the exporters.
    assert evaluator["evaluated_step"] == chief["final_step"] and chief["evaluated_step"] is None
    steps = eval_steps(model_dir)
    assert steps == sorted(set(steps)) and len(steps) >= 4 and steps[-1] == chief["final_step"]
    event_files = os.listdir(os.path.join(model_dir, "eval"))  # torch names them ...<host>.<pid>.<n>
    assert event_files and all(f".{evaluator['pid']}." in name for name in event_files)
    calls = [json.loads(line) for line in open(tmp_path / "calls.jsonl")]
    assert {call["task"] for call in calls} == {"evaluator"} and calls[-1] == {
        "task": "evaluator",
        "pid": evaluator["pid"],
        "step": chief["final_step"],
        "final": True,
    }
    # The evaluator's best, its first evaluation, survived the chief's retention (keep_checkpoint_max=3).
    best = read_best(model_dir)
    assert [record.step for record in best] == steps[:1] and os.path.isdir(best[0].path)
    newest = [entry["step"] for entry in te.checkpoint.CheckpointStore(model_dir).history()][-3:]
    assert steps[0] not in newest
    assert not os.path.exists(os.path.join(model_dir, EVALUATOR_FILE)) or read_evaluating_step(model_dir) is None
    assert TRAINING_RUN_FILE in os.listdir(model_dir)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_whole_job_restarted_with_a_higher_max_steps_is_evaluated_to_its_new_end(tmp_path):
    model_dir = str(tmp_path / "model")
    never = 1000  # patience: no early stopping
    chief, worker, evaluator = run_job(tmp_path, model_dir, (20, never))
    assert chief["final_step"] == worker["final_step"] == evaluator["evaluated_step"] == 20
    # The same three tasks again, with a higher max_steps: the evaluator follows the new run to its end.
    chief, worker, evaluator = run_job(tmp_path, model_dir, (40, never))
    assert chief["final_step"] == worker["final_step"] == evaluator["evaluated_step"] == 40
    steps = eval_steps(model_dir)
    assert steps[-1] == 40 and any(20 < step < 40 for step in steps) and steps.count(20) == 1
    calls = [json.loads(line) for line in open(tmp_path / "calls.jsonl")]
    assert [call["step"] for call in calls if call["final"]] == [20, 40]
    run = read_training_run(model_dir)
    assert (run.start_step, run.end_step, run.end_cause, run.max_steps) == (20, 40, END_MAX_STEPS, 40)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_whole_job_rerun_after_early_stopping_takes_no_step_and_every_task_ends(tmp_path):
    model_dir = str(tmp_path / "model")
    chief, _, evaluator = run_job(tmp_path, model_dir)
    stopped_at = chief["final_step"]
    assert stopped_at < 1_000_000 and evaluator["evaluated_step"] == stopped_at
    chief, _worker, evaluator = run_job(tmp_path, model_dir)
    newest = te.checkpoint.CheckpointStore(model_dir).history()[-1]["step"]
    assert newest == stopped_at and evaluator["evaluated_step"] == stopped_at
    run = read_training_run(model_dir)
    assert (run.start_step, run.end_step, run.end_cause) == (stopped_at, stopped_at, END_EARLY_STOPPING)


@pytest.mark.slow
@pytest.mark.distributed
def test_chief_worker_and_evaluator_share_only_an_s3_model_dir(tmp_path, s3_bucket):
    """The job of the test above with model_dir on moto's S3 server: the run record, the stop signal, best.json,
    the evaluator's file and eval/ all go through the store."""
    model_dir = f"{s3_bucket}/model"
    chief, worker, evaluator = run_job(tmp_path, model_dir)
    signal = read_stop_signal(model_dir)
    assert chief["final_step"] == worker["final_step"] < 1_000_000 and signal.step <= chief["final_step"]
    run = read_training_run(model_dir)
    assert run.run_id == signal.run_id and run.end_step == chief["final_step"] and "EarlyStopping" in run.end_reason
    assert evaluator["evaluated_step"] == chief["final_step"] and chief["evaluated_step"] is None
    steps = eval_steps(model_dir)
    assert len(steps) >= 4 and steps[-1] == chief["final_step"]
    best = read_best(model_dir)
    assert [record.step for record in best] == steps[:1] and best[0].path.startswith(f"{model_dir}/ckpt-{steps[0]}.")
    assert te.checkpoint.CheckpointStore(model_dir).restore(best[0].path).step == steps[0]
