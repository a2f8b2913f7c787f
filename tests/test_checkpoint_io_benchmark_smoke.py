"""Smoke test of benchmarks/checkpoint_io.py: it runs on tiny states, prints every figure with wall and CPU
time and a parseable final line, and refuses bad arguments. The timings themselves are not asserted."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, final_line, imported_script

NUMBER = r"\d+\.\d+"
FINAL_LINE = re.compile(
    rf"^checkpoint_io save_vs_torch=({NUMBER}) load_vs_torch=({NUMBER}) peak_mb_500=(-?{NUMBER}) "
    rf"save_40_vs_10=({NUMBER})$"
)


@pytest.mark.slow
def test_the_benchmark_prints_every_figure_and_its_final_line(tmp_path):
    completed = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "checkpoint_io.py"),
            "--sizes-mb",
            "3",
            "6",
            "--rounds",
            "1",
            "--many-saves",
            "2",
            "--many-count",
            "40",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    output = completed.stdout
    match = final_line(output, FINAL_LINE)
    assert all(float(value) > 0 for value in (match.group(1), match.group(2), match.group(4)))
    for kind in ("save", "load"):
        sizes = re.findall(
            rf"  {kind} (\d+) MB: ours=.*s\(cpu .*s\) torch=.*s\(cpu .*s\) safetensors=.*ours/torch=", output
        )
        assert [int(size) for size in sizes] == [3, 6], output
    assert re.search(r"stall 6 MB: synchronous save .*s .*async_checkpoint .*s .*published after .*s", output)
    assert "peak memory of one save of 6 MB" in output
    assert "one save in a model_dir with 10 checkpoints" in output and "with 40 checkpoints" in output
    assert re.search(r"total: .*s wall, .*s cpu", output)
    assert list(tmp_path.iterdir()) == []  # the scratch folder is removed


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--rounds", "0"], "must be at least 1"),
        (["--many-count", "10"], "--many-count must be above 10"),
    ],
)
def test_bad_arguments_are_refused(arguments, message, capsys):
    with imported_script("checkpoint_io") as module:
        with pytest.raises(SystemExit) as raised:
            module.parse_settings(arguments)
    assert raised.value.code == 2 and message in capsys.readouterr().err


def test_a_copied_checkpoint_is_a_valid_one_of_its_new_step(tmp_path):
    """The 1000-checkpoint model_dir is made of copies: each must be a checkpoint the store accepts as is."""
    import torch

    from torchestimator.checkpoint import CheckpointStore

    with imported_script("checkpoint_io") as module:
        store = CheckpointStore(tmp_path / "model_dir")
        first = store.save(1, {"weight": torch.ones(2)}, extra=module.replica_extra(1))
        module.copy_checkpoint(first, str(tmp_path / "model_dir" / "ckpt-7"), 7)
    restored = CheckpointStore(tmp_path / "model_dir").restore()
    assert restored.step == 7 and torch.equal(restored.model_state["weight"], torch.ones(2))
