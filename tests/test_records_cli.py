"""`torchestimator convert csv-to-tfrecord`, `records inspect` and `records verify`."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from torchestimator import cli
from torchestimator.cli import records as records_cli
from torchestimator.data.example import decode_example, encode_example, encode_sequence_example
from torchestimator.data.tfrecord import TFRecordWriter, iter_records

FIXTURES = Path(__file__).parent / "fixtures"


def run(argv: list[str]) -> int:
    """Runs a command exactly as `torchestimator ...` does."""
    return cli.main(argv)


def write_png(path: Path, shape: tuple[int, ...], mode: str, seed: int) -> np.ndarray:
    Image = pytest.importorskip("PIL.Image")  # only the image tests need Pillow (the bench/images extra)
    pixels = np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
    Image.fromarray(pixels, mode=mode).save(path)
    return pixels


@pytest.fixture()
def index(tmp_path: Path) -> dict[str, Any]:
    """data/index.csv with 5 rows whose images (relative paths) live in data/images/."""
    folder = tmp_path / "data"
    (folder / "images").mkdir(parents=True)
    shapes = [((3, 4, 3), "RGB"), ((5, 2), "L"), ((2, 2, 4), "RGBA"), ((1, 6, 3), "RGB"), ((4, 4), "L")]
    pixels = [
        write_png(folder / "images" / f"{index}.png", shape, mode, index) for index, (shape, mode) in enumerate(shapes)
    ]
    rows = [
        {"label": "3", "path": "images/0.png", "weight": "0.5", "name": "héllo", "code": "007", "count": "10"},
        {"label": "1", "path": "images/1.png", "weight": "", "name": "b", "code": "12", "count": "-2"},
        {"label": "0", "path": "images/2.png", "weight": "2", "name": "c", "code": "3", "count": "0"},
        {
            "label": "1",
            "path": "images/3.png",
            "weight": "1e-3",
            "name": "",
            "code": "4",
            "count": "9223372036854775807",
        },
        {
            "label": "2",
            "path": str(folder / "images" / "4.png"),
            "weight": "-1.25",
            "name": "e",
            "code": "5",
            "count": "1",
        },
    ]
    path = folder / "index.csv"
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return {"path": path, "rows": rows, "pixels": pixels, "folder": folder}


def read_shards(paths: list[Path], compression: str | None = None) -> list[dict[str, Any]]:
    return [decode_example(record) for path in paths for _, record in iter_records(path, compression)]


def test_csv_to_tfrecord_encoded_shards(index: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    prefix = tmp_path / "out" / "train"
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(prefix), "--num_shards", "2"]) == 0
    shards = [tmp_path / "out" / "train-00000-of-00002.tfrecord", tmp_path / "out" / "train-00001-of-00002.tfrecord"]
    assert sorted((tmp_path / "out").iterdir()) == shards  # nothing else, no .partial left behind
    assert [len(list(iter_records(shard))) for shard in shards] == [3, 2]
    examples = read_shards(shards)
    assert [int(example["label"][0]) for example in examples] == [3, 1, 0, 1, 2]  # CSV order kept
    for number, example in enumerate(examples):
        image_file = index["folder"] / "images" / f"{number}.png"
        assert example["image"] == [image_file.read_bytes()]
        assert example["image/format"] == [b"png"]
        assert example["path"] == [index["rows"][number]["path"].encode()]
    assert examples[0]["weight"].dtype == np.float32 and examples[0]["weight"].tolist() == [0.5]
    assert examples[1]["weight"].size == 0  # an empty cell is an empty list
    assert examples[0]["name"] == ["héllo".encode()] and examples[3]["name"] == []
    assert examples[0]["code"] == [b"007"]  # leading zero: kept as text
    assert examples[3]["count"].dtype == np.int64 and examples[3]["count"].tolist() == [2**63 - 1]
    assert "wrote 5 records to 2 shard(s)" in capsys.readouterr().out


def test_csv_to_tfrecord_raw_pixels_with_shape(index: dict[str, Any], tmp_path: Path) -> None:
    prefix = tmp_path / "raw"
    assert (
        run(["convert", "csv-to-tfrecord", str(index["path"]), str(prefix), "--image-mode", "raw", "--no-progress"])
        == 0
    )
    examples = read_shards([tmp_path / "raw-00000-of-00001.tfrecord"])
    for example, pixels in zip(examples, index["pixels"], strict=True):
        expected = pixels if pixels.ndim == 3 else pixels[:, :, None]
        assert example["image/shape"].tolist() == list(expected.shape)
        restored = np.frombuffer(example["image"][0], dtype=np.uint8).reshape(example["image/shape"])
        np.testing.assert_array_equal(restored, expected)
        assert "image/format" not in example


def test_raw_mode_keeps_gray_alpha_as_two_channels_and_every_16_bit_png_as_its_high_byte(tmp_path: Path) -> None:
    """TF's decode_image rules (data/images.py), the same for every colour type: no mode becomes 8-bit another way."""
    Image = pytest.importorskip("PIL.Image")
    from torchestimator.data.images import decode_png

    rng = np.random.default_rng(5)
    gray_alpha = rng.integers(0, 256, (3, 4, 2), dtype=np.uint8)
    Image.fromarray(gray_alpha, "LA").save(tmp_path / "la.png")
    gray16 = rng.integers(0, 65536, (3, 4), dtype=np.uint16)
    Image.fromarray(gray16).save(tmp_path / "gray16.png")
    rgb16 = (FIXTURES / "images" / "rgb16.png").read_bytes()  # Pillow cannot write one; the fixture's
    (tmp_path / "rgb16.png").write_bytes(rgb16)
    (tmp_path / "i.csv").write_text("label,path\n1,la.png\n2,gray16.png\n3,rgb16.png\n", encoding="utf-8")
    assert (
        run(
            [
                "convert",
                "csv-to-tfrecord",
                str(tmp_path / "i.csv"),
                str(tmp_path / "o"),
                "--image-mode",
                "raw",
                "--no-progress",
            ]
        )
        == 0
    )
    examples = read_shards([tmp_path / "o-00000-of-00001.tfrecord"])
    expected = [
        gray_alpha,
        (gray16 >> 8).astype(np.uint8)[..., None],
        (decode_png(rgb16, dtype="uint16") >> 8).astype(np.uint8),
    ]
    for example, pixels in zip(examples, expected, strict=True):
        assert example["image/shape"].tolist() == list(pixels.shape)
        np.testing.assert_array_equal(
            np.frombuffer(example["image"][0], np.uint8).reshape(example["image/shape"]), pixels
        )


def test_csv_to_tfrecord_gzip_and_other_column_names(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"not an image, stored as it is")
    index = tmp_path / "files.csv"
    index.write_text("file,class,score\na.bin,cat,0.25\n", encoding="utf-8")
    assert (
        run(
            [
                "convert",
                "csv-to-tfrecord",
                str(index),
                str(tmp_path / "s"),
                "--label-column",
                "class",
                "--path-column",
                "file",
                "--compression",
                "GZIP",
            ]
        )
        == 0
    )
    shard = tmp_path / "s-00000-of-00001.tfrecord"
    assert shard.read_bytes()[:2] == b"\x1f\x8b"
    (example,) = read_shards([shard], "GZIP")
    assert example["class"] == [b"cat"] and example["image"] == [b"not an image, stored as it is"]
    assert example["score"].tolist() == [0.25] and example["image/format"] == [b"bin"]


def test_relative_paths_resolve_against_the_csv_folder(index: dict[str, Any], tmp_path: Path, monkeypatch: Any) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), "here"]) == 0
    examples = read_shards([elsewhere / "here-00000-of-00001.tfrecord"])
    assert examples[0]["image"] == [(index["folder"] / "images" / "0.png").read_bytes()]


def test_more_shards_than_rows_gives_empty_shards(index: dict[str, Any], tmp_path: Path) -> None:
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(tmp_path / "x"), "--num-shards", "7"]) == 0
    shards = sorted(tmp_path.glob("x-*-of-00007.tfrecord"))
    assert len(shards) == 7
    assert [len(list(iter_records(shard))) for shard in shards] == [1, 1, 1, 1, 1, 0, 0]


def test_missing_image_names_the_row_and_path(index: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    (index["folder"] / "images" / "2.png").unlink()
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(tmp_path / "bad"), "--num-shards", "2"]) == 2
    error = capsys.readouterr().err
    assert "row 3" in error and "images/2.png" in error and "does not exist" in error
    assert not list(tmp_path.glob("bad*"))  # nothing written


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--label_column", "klass"], "--label_column 'klass' is not a column"),
        (["--num-shards", "0"], "--num_shards must be at least 1"),  # the dashed alias
        (["--path_column", "label"], "--label_column and --path_column are both 'label'"),
    ],
)
def test_bad_arguments_are_explained(
    index: dict[str, Any], tmp_path: Path, capsys: Any, extra: list[str], expected: str
) -> None:
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(tmp_path / "o"), *extra]) == 2
    assert expected in capsys.readouterr().err
    assert not list(tmp_path.glob("o-*"))


def test_undecodable_image_in_raw_mode(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("PIL.Image")
    (tmp_path / "a.png").write_bytes(b"garbage")
    (tmp_path / "i.csv").write_text("label,path\n1,a.png\n", encoding="utf-8")
    assert run(["convert", "csv-to-tfrecord", str(tmp_path / "i.csv"), str(tmp_path / "o"), "--image-mode", "raw"]) == 2
    error = capsys.readouterr().err
    assert (
        "row 1 (line 2): " in error
        and "a.png is not an image --image_mode raw can decode (unknown image file format" in error
        and "--image_mode encoded" in error
    )
    assert not list(tmp_path.glob("o-*"))


def test_raw_mode_without_pillow_says_what_to_install(
    index: dict[str, Any], tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(tmp_path / "o"), "--image-mode", "raw"]) == 2
    error = capsys.readouterr().err
    assert "Pillow" in error and "--image_mode encoded" in error


def test_progress_bar_only_on_a_tty(index: dict[str, Any], tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(tmp_path / "p")]) == 0
    assert "csv-to-tfrecord" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(tmp_path / "q")]) == 0
    assert "csv-to-tfrecord: 100%" in capsys.readouterr().err
    assert run(["convert", "csv-to-tfrecord", str(index["path"]), str(tmp_path / "r"), "--no-progress"]) == 0
    assert "csv-to-tfrecord" not in capsys.readouterr().err


def test_column_kinds() -> None:
    assert records_cli.column_kind(["1", "-2", ""]) == "int64"
    assert records_cli.column_kind(["1", "2.5"]) == "float"
    assert records_cli.column_kind(["007", "8"]) == "bytes"
    assert records_cli.column_kind([str(2**63), "1.5"]) == "bytes"  # beyond int64: an id, not a number
    assert records_cli.column_kind(["+3", "1.5"]) == "bytes"
    assert records_cli.column_kind(["a", "1"]) == "bytes"
    assert records_cli.column_kind(["", " "]) == "bytes"


# --------------------------------------------------------------------------- records inspect / verify


def write_examples(path: Path, compression: str | None = None) -> list[bytes]:
    records = [
        encode_example(
            {
                "label": [index],
                "vec": [0.5, float(index)],
                "text": [b"\xff\x00", "ok"][: index + 1],
                "tags": list(range(index)),
            },
            kinds={"tags": "int64"},
        )
        for index in range(3)
    ]
    with TFRecordWriter(path, compression=compression) as writer:
        for record in records:
            writer.write(record)
    return records


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_inspect_prints_schema_and_first_records(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "d.tfrecord.gz"
    write_examples(path, "GZIP")
    assert run(["records", "inspect", str(path), "--limit", "2"]) == 0  # compression detected
    out = capsys.readouterr().out
    assert f"{path}: 3 records (tf.train.Example)" in out
    schema = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert schema["label"] == ["int64", "1", "3/3"]
    assert schema["vec"] == ["float", "2", "3/3"]
    assert schema["tags"] == ["int64", "0..2", "3/3"]
    assert schema["text"] == ["bytes", "1..2", "3/3"]
    records = json_lines(out)
    assert len(records) == 2
    assert records[0]["features"]["label"] == [0] and records[1]["features"]["vec"] == [0.5, 1.0]
    assert records[0]["features"]["text"] == ["base64:/wA="] and records[1]["features"]["text"][1] == "ok"
    assert records[1]["offset"] > 0


def test_inspect_sequence_examples(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "s.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write(encode_sequence_example({"length": [2]}, {"tokens": [[1], [2, 3]]}))
    assert run(["records", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 records (tf.train.SequenceExample)" in out and "feature lists:" in out
    tokens = next(line.split() for line in out.splitlines() if line.startswith("  tokens"))
    assert tokens == ["tokens", "int64", "2", "1..2", "1/1"]
    assert json_lines(out)[0]["feature_lists"]["tokens"] == [[1], [2, 3]]


def test_inspect_records_that_are_not_examples(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "raw.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write(b"\xff\xff\xff")
    assert run(["records", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 records" in out and "not every record is a tf.train.Example" in out
    assert json_lines(out)[0]["raw"].startswith("base64:")


def test_verify_reports_counts_and_first_bad_offset(tmp_path: Path, capsys: Any) -> None:
    good = tmp_path / "good.tfrecord"
    records = write_examples(good)
    bad = tmp_path / "bad.tfrecord"
    data = bytearray(good.read_bytes())
    second = 16 + len(records[0])
    data[second + 12] ^= 0x01  # a data byte of record 2
    bad.write_bytes(bytes(data))
    assert run(["records", "verify", str(good)]) == 0
    assert f"OK      {good}: 3 records" in capsys.readouterr().out
    assert run(["records", "verify", str(tmp_path / "*.tfrecord")]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {bad}: 1 good records, first bad record at offset {second}" in out
    assert "2 file(s): 1 ok, 1 damaged" in out


def test_verify_and_inspect_take_max_record_size(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "big.tfrecord"
    big = encode_example({"image": [bytes(3 << 20)]})
    with TFRecordWriter(path) as writer:
        writer.write(big)
    assert run(["records", "verify", "--max_record_size", str(1 << 20), str(path)]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {path}: 0 good records, first bad record at offset 0: record too large at 0" in out
    assert re.search(rf"--max[-_]record[-_]size {len(big)}\b", out)  # the hint names the size to pass
    assert run(["records", "inspect", "--max-record-size", str(1 << 20), str(path)]) == 2
    assert "record too large at 0" in capsys.readouterr().err
    assert run(["records", "verify", "--max-record-size", str(len(big)), str(path)]) == 0
    assert run(["records", "verify", str(path)]) == 0  # the default, 2 GiB - 1


def test_verify_truncated_file_and_missing_file(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "cut.tfrecord"
    write_examples(path)
    path.write_bytes(path.read_bytes()[:-3])
    assert run(["records", "verify", str(path)]) == 1
    assert "truncated record at" in capsys.readouterr().out
    assert run(["records", "verify", str(tmp_path / "missing.tfrecord")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_max_record_size_bounds_small_records_too(tmp_path: Path, capsys: Any) -> None:
    """--max_record_size 10 let 157- and 488-byte records through: only records bigger than a read block were
    compared with it."""
    path = tmp_path / "small.tfrecord"
    with TFRecordWriter(path) as writer:
        for record in (b"tiny", bytes(157), bytes(488)):
            writer.write(record)
    assert run(["records", "verify", "--max_record_size", "10", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {path}: 1 good records, first bad record at offset 20: record too large at 20" in out
    assert "--max_record_size 157" in out
    assert run(["records", "inspect", "--max_record_size", "10", str(path)]) == 2
    assert "record too large at 20" in capsys.readouterr().err
    assert run(["records", "verify", "--max_record_size", "488", str(path)]) == 0
