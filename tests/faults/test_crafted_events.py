"""Crafted TensorBoard event files read back by read_scalars (early stopping after a restart, ``plot``).

Event files are TFRecord-framed ``Event`` protos in model_dir. A damaged or crafted one must end
the file's reading with a warning naming it, keep what came before, and never allocate what a
record declares: a length of 2**60, or a scalar tensor whose shape declares 2**28 elements
around one stored float (TensorBoard's ``make_ndarray`` fills the shape). The reads run in a
child whose address space is capped at what it maps plus 300 MB.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from torchestimator._io.summary import SummaryWriter
from torchestimator.data.tfrecord import TFRecordWriter, masked_crc32c

TOOLS = Path(__file__).resolve().parents[2] / "tools"
EVENT_NAME = "events.out.tfevents.1700000000.host.1.0"

CHILD = r"""
import json, logging, sys
sys.path.insert(0, sys.argv[1])
from faults_common import limit_memory
from torchestimator._io.summary import read_scalars

warnings = []

class Collect(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())

logging.getLogger("torchestimator").addHandler(Collect())
limit_memory(300)
results = {}
for logdir in sys.argv[2:]:
    warnings.clear()
    try:
        results[logdir] = {"scalars": read_scalars(logdir), "warnings": list(warnings)}
    except BaseException as error:
        results[logdir] = {"raised": f"{type(error).__name__}: {error}"}
print(json.dumps(results))
"""


def good_events(logdir: Path) -> Path:
    with SummaryWriter(logdir) as writer:
        writer.scalar("accuracy", 0.5, step=100)
    (path,) = logdir.glob("events.out.tfevents.*")
    return path


def append_record(path: Path, record: bytes) -> None:
    framed = path.with_suffix(".record")
    with TFRecordWriter(framed) as writer:
        writer.write(record)
    with open(path, "ab") as file:
        file.write(framed.read_bytes())
    framed.unlink()


def scalar_tensor_event(elements: int) -> bytes:
    value = Summary.Value(tag="bomb")
    value.tensor.dtype = 1  # DT_FLOAT
    value.tensor.tensor_shape.dim.add(size=elements)
    value.tensor.float_val.append(1.0)
    return Event(step=200, wall_time=1.0, summary=Summary(value=[value])).SerializeToString()


def crafted_logdirs(root: Path) -> dict[str, Path]:
    cases = {}
    cases["length_bomb"] = root / "length_bomb"
    path = good_events(cases["length_bomb"])
    header = struct.pack("<Q", 2**60)
    with open(path, "ab") as file:
        file.write(header + struct.pack("<I", masked_crc32c(header)) + b"\0" * 4096)
    cases["shape_bomb"] = root / "shape_bomb"
    append_record(good_events(cases["shape_bomb"]), scalar_tensor_event(2**28))
    cases["not_an_event"] = root / "not_an_event"
    append_record(good_events(cases["not_an_event"]), b"\xff\xff\xff\xff not a protobuf")
    cases["bad_crc"] = root / "bad_crc"
    path = good_events(cases["bad_crc"])
    append_record(path, Event(step=300, wall_time=2.0).SerializeToString())
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last record's data CRC
    path.write_bytes(bytes(data))
    return cases


def test_crafted_event_files_keep_what_came_before_in_bounded_memory(tmp_path) -> None:
    cases = crafted_logdirs(tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(TOOLS), *map(str, cases.values())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(child.stdout)
    for name, logdir in cases.items():
        result = results[str(logdir)]
        assert "raised" not in result, f"{name}: {result}"
        assert result["scalars"] == {"accuracy": [[100, 0.5]]}, f"{name}: {result}"
    # A record reaching past the end is a file still being written: quiet, as in TensorBoard.
    assert results[str(cases["length_bomb"])]["warnings"] == []
    for name in ("not_an_event", "bad_crc"):
        (warning,) = results[str(cases[name])]["warnings"]
        assert "Skipping the rest of event file" in warning and str(cases[name]) in warning, warning
