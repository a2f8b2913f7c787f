"""data/images.py against TensorFlow 2.21's own outputs (tests/fixtures/images, made by tools/make_image_fixtures.py).

Every decode rule (channels, 16-bit, dtype, palettes, tRNS, GIF frames, JPEG DCT methods) and every resize
method is compared with what tf.io / tf.image gave for the same bytes; then the errors, ImageDecoding and
its JSON form.
"""

from __future__ import annotations

import io
import json
import logging
import pathlib

import numpy as np
import pytest

from torchestimator.data import images
from torchestimator.data.images import ImageDecoding, decode_image, decode_jpeg, decode_png, resize_image
from torchestimator.errors import ConfigError, ConfigTypeError, ImageDecodeError, TorchEstimatorError

Image = pytest.importorskip("PIL.Image")

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "images"
EXPECTED = dict(np.load(FIXTURES / "expected.npz"))
DECODE_KEYS = sorted(key for key in EXPECTED if not key.startswith("resize|"))
RESIZE_KEYS = sorted(key for key in EXPECTED if key.startswith("resize|") and key != "resize|input")


def _ours(key: str) -> np.ndarray:
    name, op, channels, option = key.split("|")
    data = (FIXTURES / name).read_bytes()
    if op == "decode_png":
        return decode_png(data, channels=int(channels), dtype=option, where=name)
    if op == "decode_jpeg":
        return decode_jpeg(data, channels=int(channels), dct_method=option, where=name)
    if op == "decode_image_first":
        return decode_image(data, expand_animations=False, where=name)
    return decode_image(data, channels=int(channels), dtype=option, where=name)


def _png(array: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("key", DECODE_KEYS)
def test_decoding_gives_tensorflows_values_dtype_and_shape(key):
    pytest.importorskip("simplejpeg")  # TF's default JPEG DCT needs it; the Pillow path is tested below
    got, want = _ours(key), EXPECTED[key]
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


def test_the_fixtures_cover_every_rule_the_module_claims():
    names = {key.split("|")[0] for key in DECODE_KEYS}
    assert {
        "gray16.png",
        "gray_alpha16.png",
        "rgb16.png",
        "rgba16.png",
        "gray_alpha.png",
        "palette_trns.png",
        "rgb_trns.png",
        "bilevel.png",
        "rgb16_interlaced.png",
        "gray_alpha16_interlaced.png",
        "photo420.jpg",
        "photo444.jpg",
        "gray.jpg",
        "animated.gif",
        "rgb.bmp",
        "rgba.bmp",
        "palette.bmp",
        "top_down.bmp",
    } <= names
    assert EXPECTED["gray_alpha.png|decode_png|0|uint8"].shape[-1] == 2  # stays 2 channels
    assert EXPECTED["animated.gif|decode_image|0|uint8"].shape[0] == 3


@pytest.fixture
def pillow_jpeg(monkeypatch, caplog):
    """JPEGs through Pillow, as without simplejpeg; the one warning re-armed."""
    monkeypatch.setattr(images, "_simplejpeg", lambda: None)
    monkeypatch.setattr(images, "_warned_accurate_fallback", False)
    caplog.set_level(logging.WARNING, logger=images.__name__)
    return caplog


@pytest.mark.parametrize("name", ["photo420.jpg", "photo444.jpg", "photo422.jpg", "gray.jpg"])
def test_pillow_gives_tensorflows_integer_accurate_jpeg_pixels_and_the_default_within_6(pillow_jpeg, name):
    data = (FIXTURES / name).read_bytes()
    for channels in (0, 1, 3):
        accurate = decode_jpeg(data, channels=channels, dct_method="INTEGER_ACCURATE")
        np.testing.assert_array_equal(accurate, EXPECTED[f"{name}|decode_jpeg|{channels}|INTEGER_ACCURATE"])
        default = decode_jpeg(data, channels=channels).astype(int)
        tf_default = EXPECTED[f"{name}|decode_jpeg|{channels}|"].astype(int)
        assert default.shape == tf_default.shape and np.abs(default - tf_default).max() <= 6  # documented bound
    assert [record.getMessage()[:50] for record in pillow_jpeg.records] == [
        "decode_jpeg: simplejpeg is not installed, so JPEGs"
    ]


def test_simplejpeg_and_pillow_agree_exactly_on_integer_accurate(pillow_jpeg):
    simplejpeg = pytest.importorskip("simplejpeg")
    data = (FIXTURES / "photo420.jpg").read_bytes()
    through_pillow = decode_jpeg(data, dct_method="INTEGER_ACCURATE")
    through_simplejpeg = images._jpeg_simplejpeg(simplejpeg, data, 0, "INTEGER_ACCURATE", None)
    np.testing.assert_array_equal(through_pillow, through_simplejpeg)


@pytest.mark.parametrize("key", RESIZE_KEYS)
def test_resize_gives_tensorflows_values(key):
    _, method, size = key.split("|")
    height, width = map(int, size.split("x"))
    got = resize_image(EXPECTED["resize|input"], (height, width), method=method)
    assert got.dtype == np.float32 and got.shape == EXPECTED[key].shape
    if method in ("bilinear", "nearest"):
        np.testing.assert_array_equal(got, EXPECTED[key])
    else:  # TF sums in another order: float32 rounding, documented as < 1e-4 on 0..255
        np.testing.assert_allclose(got, EXPECTED[key], rtol=0, atol=1e-4)


def test_bilinear_equals_torch_interpolate_within_float_rounding_and_batches_resize_alike():
    import torch

    image = EXPECTED["resize|input"]
    ours = resize_image(image, (20, 23))
    theirs = (
        torch.nn.functional.interpolate(
            torch.from_numpy(image).permute(2, 0, 1)[None].float(), size=(20, 23), mode="bilinear", align_corners=False
        )[0]
        .permute(1, 2, 0)
        .numpy()
    )
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=0)  # float32 rounding: measured 2e-6 relative
    np.testing.assert_array_equal(resize_image(np.stack([image, image]), (20, 23))[1], ours)


def test_resize_refuses_bad_arguments():
    image = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match=r"method must be one of \['bilinear', 'nearest', 'bicubic', 'area'\]"):
        resize_image(image, (2, 2), method="lanczos3")
    with pytest.raises(ValueError, match=r"size must be \(height, width\), two integers > 0; received \(2, 0\)"):
        resize_image(image, (2, 0))
    with pytest.raises(ValueError, match=r"received shape \[4, 4\]"):
        resize_image(image[..., 0], (2, 2))
    with pytest.raises(TypeError, match="must hold numbers"):
        resize_image(np.array([[["a"]]]), (2, 2))


# --------------------------------------------------------------------------- errors


def test_every_refusal_is_an_image_decode_error_naming_where_and_the_format():
    png = (FIXTURES / "rgb.png").read_bytes()
    jpeg = (FIXTURES / "photo420.jpg").read_bytes()
    gif = (FIXTURES / "animated.gif").read_bytes()
    bmp = (FIXTURES / "rgb.bmp").read_bytes()
    cases = [
        (
            lambda: decode_image(b"hello world", where="f.csv row 3"),
            "unknown",
            r"^f\.csv row 3: unknown image file format: one of PNG, JPEG, GIF or BMP is required",
        ),
        (lambda: decode_image(png[:60], where="a.png"), "png", r"^a\.png: the PNG data cannot be decoded"),
        (lambda: decode_image(png[:20], where="a.png"), "png", r"IHDR chunk is missing or cut short"),
        (lambda: decode_image(jpeg[:300], where="b.jpg"), "jpeg", r"^b\.jpg: the JPEG data cannot be decoded"),
        (lambda: decode_image(jpeg, channels=4, where="b.jpg"), "jpeg", "JPEG does not support 4 channels"),
        (
            lambda: decode_image(png, channels=2, where="a.png"),
            "png",
            r"channels must be one of \[0, 1, 3, 4\] for PNG; received 2",
        ),
        (
            lambda: decode_image(gif, channels=1, where="c.gif"),
            "gif",
            r"channels must be one of \[0, 3\] for GIF; received 1",
        ),
        (lambda: decode_png(gif, where="c.gif"), "gif", r"got 3 frames, but an animated GIF can only be decoded"),
        (lambda: decode_image(png, dtype="float64", where="x"), "png", r"dtype must be one of"),
        (lambda: decode_png(png, dtype="float32", where="x"), "png", r'dtype must be "uint8" or "uint16"'),
        (lambda: decode_jpeg(jpeg, dct_method="FAST", where="x"), "jpeg", r"dct_method must be one of"),
        (lambda: decode_image(b"BM" + bytes(60), where="d.bmp"), "bmp", r"^d\.bmp: a BMP with 0 bits per pixel"),
        (lambda: decode_image(bmp[:-1], where="d.bmp"), "bmp", r"the BMP is \d+ bytes, its header says \d+ \+ 5 rows"),
        (lambda: decode_image(bmp[:20], where="d.bmp"), "bmp", r"incomplete BMP: the header needs 32 bytes"),
        (lambda: decode_image(bmp, channels=1, where="d.bmp"), "bmp", r"channels must be one of \[0, 3, 4\] for BMP"),
        (lambda: decode_png(bmp, where="d.bmp"), "bmp", r"decode_png and decode_jpeg do not decode BMP .*decode_image"),
        (lambda: decode_image(b"RIFF\0\0\0\0WEBPVP8 ", where="e"), "webp", r"WEBP images are not decoded here"),
        (
            lambda: decode_image("not bytes", where="request input 'image' [0]"),
            "unknown",
            r"^request input 'image' \[0\]: expected the encoded image as bytes; received str",
        ),
        (lambda: decode_image(gif[:40], where="c.gif"), "gif", r"^c\.gif: "),
    ]
    for call, fmt, pattern in cases:
        with pytest.raises(ImageDecodeError, match=pattern) as raised:
            call()
        assert isinstance(raised.value, (TorchEstimatorError, ValueError)) and raised.value.format == fmt
        assert raised.value.where == str(raised.value).split(": ")[0]


def test_the_pillow_jpeg_path_refuses_damaged_bytes_and_cmyk(pillow_jpeg):
    with pytest.raises(ImageDecodeError, match=r"^b\.jpg: the JPEG data cannot be decoded"):
        decode_jpeg((FIXTURES / "photo420.jpg").read_bytes()[:300], where="b.jpg")
    buffer = io.BytesIO()
    Image.new("CMYK", (8, 8)).save(buffer, "JPEG")
    with pytest.raises(ImageDecodeError, match=r"CMYK JPEGs are not decoded here"):
        decode_jpeg(buffer.getvalue())


def test_cmyk_jpegs_are_refused_through_simplejpeg_too():
    pytest.importorskip("simplejpeg")
    buffer = io.BytesIO()
    Image.new("CMYK", (8, 8)).save(buffer, "JPEG")
    with pytest.raises(ImageDecodeError, match=r"^image: CMYK JPEGs are not decoded here"):
        decode_image(buffer.getvalue())


def test_image_decode_error_pickles_as_itself():
    import pickle

    error = pickle.loads(pickle.dumps(ImageDecodeError("x: bad", where="x", format="png")))
    assert (type(error), str(error), error.where, error.format) == (ImageDecodeError, "x: bad", "x", "png")


# --------------------------------------------------------------------------- ImageDecoding


def test_image_decoding_is_decode_resize_scale_and_layout():
    data = (FIXTURES / "rgba.png").read_bytes()
    decoding = ImageDecoding(size=(5, 7), channels=3, scale=1 / 255, layout="CHW")
    expected = resize_image(decode_image(data, channels=3), (5, 7)) * np.float32(1 / 255)
    got = decoding.decode(data)
    assert got.dtype == np.float32 and got.shape == decoding.shape == (3, 5, 7)
    np.testing.assert_array_equal(got, expected.transpose(2, 0, 1))
    batch = decoding.decode_batch([data, (FIXTURES / "gray.png").read_bytes()])
    assert batch.shape == (2, 3, 5, 7)
    np.testing.assert_array_equal(batch[0], got)
    hwc = ImageDecoding(size=(5, 7), channels=1, method="nearest")
    np.testing.assert_array_equal(
        hwc.decode(data), resize_image(decode_image(data, channels=1), (5, 7), method="nearest")
    )


def test_image_decoding_uses_its_dct_method_for_jpegs():
    pytest.importorskip("simplejpeg")
    data = (FIXTURES / "photo420.jpg").read_bytes()
    for dct in ("", "INTEGER_ACCURATE"):
        decoding = ImageDecoding(size=(24, 40), dct_method=dct)
        np.testing.assert_array_equal(
            decoding.decode(data), resize_image(EXPECTED[f"photo420.jpg|decode_jpeg|3|{dct}"], (24, 40))
        )


def test_decode_batch_names_the_item_that_fails():
    decoding = ImageDecoding(size=(4, 4))
    good = (FIXTURES / "rgb.png").read_bytes()
    with pytest.raises(ImageDecodeError, match=r"^request input 'image' \[1\]: unknown image file format") as raised:
        decoding.decode_batch([good, b"junk"], where="request input 'image'")
    assert raised.value.where == "request input 'image' [1]"


def test_image_decoding_json_round_trips_through_text():
    decoding = ImageDecoding(
        size=(224, 224), channels=1, method="area", layout="CHW", scale=0.5, dct_method="INTEGER_ACCURATE"
    )
    text = json.dumps(decoding.to_json())
    assert ImageDecoding.from_json(json.loads(text)) == decoding
    assert ImageDecoding.from_json({"size": [8, 9]}) == ImageDecoding(size=(8, 9))


@pytest.mark.parametrize(
    ("data", "error", "pattern"),
    [
        (
            {"size": [8, 8], "colour": 3},
            ConfigError,
            r"^signature.json inputs\.image: unknown key\(s\) \['colour'\]; an image decoding has",
        ),
        ({"channels": 3}, ConfigError, r"^signature.json inputs\.image: the key 'size' is missing"),
        ([8, 8], ConfigError, r"expected an object with"),
        ({"size": [8, -1]}, ConfigError, r"inputs\.image: ImageDecoding\.size must be \(height, width\)"),
        (
            {"size": [8, 8], "channels": 2},
            ConfigError,
            r"inputs\.image: ImageDecoding\.channels must be one of \[1, 3, 4\]",
        ),
        ({"size": [8, 8], "channels": True}, ConfigError, r"channels must be one of"),
        ({"size": [8, 8], "method": "lanczos"}, ConfigError, r"ImageDecoding\.method must be one of"),
        ({"size": [8, 8], "layout": "NHWC"}, ConfigError, r"ImageDecoding\.layout must be one of \['HWC', 'CHW'\]"),
        ({"size": [8, 8], "scale": "1/255"}, ConfigTypeError, r"ImageDecoding\.scale must be a number or None"),
        ({"size": [8, 8], "scale": float("nan")}, ConfigError, r"ImageDecoding\.scale must be finite"),
        ({"size": [8, 8], "dct_method": "fast"}, ConfigError, r"ImageDecoding\.dct_method must be one of"),
    ],
)
def test_image_decoding_from_json_refuses_what_it_did_not_write(data, error, pattern):
    with pytest.raises(error, match=pattern):
        ImageDecoding.from_json(data, where="signature.json inputs.image")


def test_image_decoding_is_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        ImageDecoding((8, 8))  # type: ignore[misc]
    decoding = ImageDecoding(size=[8, 9])
    assert decoding.size == (8, 9)
    with pytest.raises(AttributeError):
        decoding.size = (1, 1)  # type: ignore[misc]


def test_gray_alpha_and_sixteen_bit_pngs_made_here_follow_the_same_rules():
    """Beyond the fixtures: Pillow-written LA and I;16 PNGs of another size."""
    rng = np.random.default_rng(3)
    gray_alpha = rng.integers(0, 256, (5, 9, 2), dtype=np.uint8)
    np.testing.assert_array_equal(decode_image(_png(gray_alpha, "LA")), gray_alpha)
    gray16 = rng.integers(0, 65536, (5, 9), dtype=np.uint16)
    data = _png(gray16)
    np.testing.assert_array_equal(decode_png(data, dtype="uint16")[..., 0], gray16)
    np.testing.assert_array_equal(decode_png(data)[..., 0], (gray16 >> 8).astype(np.uint8))


# --------------------------------------------------------------------------- TFRecordDataset(images=...)


def _image_records(tmp_path, names):
    from torchestimator.data import TFRecordWriter, encode_example

    path = tmp_path / "images.tfrecord"
    contents = [(FIXTURES / name).read_bytes() for name in names]
    with TFRecordWriter(str(path)) as writer:
        for label, data in enumerate(contents):
            writer.write(
                encode_example({"image": [data], "label": [label]}, kinds={"image": "bytes", "label": "int64"})
            )
    return path, contents


IMAGE_NAMES = ["rgb.png", "gray.png", "rgba16.png", "palette_trns.png", "gray_alpha.png", "photo420.jpg", "still.gif"]


def test_a_tfrecord_of_images_batches_as_decode_batch_of_the_same_bytes_and_resumes_exactly(tmp_path):
    import torch

    from torchestimator.data import FixedLenFeature, TFRecordDataset

    path, contents = _image_records(tmp_path, IMAGE_NAMES)
    decoding = ImageDecoding(size=(6, 5), layout="CHW", scale=1 / 255)
    features = {"image": FixedLenFeature([], "string"), "label": FixedLenFeature([], "int64")}
    dataset = TFRecordDataset(str(path), features=features, label_key="label", images={"image": decoding}, batch_size=3)
    batches = list(dataset)
    assert [tuple(images["image"].shape) for images, _ in batches] == [(3, 3, 6, 5), (3, 3, 6, 5), (1, 3, 6, 5)]
    assert batches[0][0]["image"].dtype == torch.float32
    np.testing.assert_array_equal(
        torch.cat([images["image"] for images, _ in batches]).numpy(), decoding.decode_batch(contents)
    )
    assert torch.cat([labels for _, labels in batches]).tolist() == list(range(len(contents)))
    iterator = iter(dataset)
    next(iterator)
    state = dataset.state_dict()
    resumed = TFRecordDataset(str(path), features=features, label_key="label", images={"image": decoding}, batch_size=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == 2 and all(torch.equal(a[0]["image"], b[0]["image"]) for a, b in zip(rest, batches[1:]))
    single = TFRecordDataset(str(path), features=features, images={"image": decoding})
    np.testing.assert_array_equal(next(iter(single))["image"].numpy(), decoding.decode(contents[0]))
    shuffled = TFRecordDataset(
        str(path), features=features, images={"image": decoding}, batch_size=4, shuffle_buffer_size=3, seed=1
    )
    plain = TFRecordDataset(str(path), features=features, batch_size=4, shuffle_buffer_size=3, seed=1)
    for with_images, without in zip(shuffled, plain, strict=True):  # same records, same order
        np.testing.assert_array_equal(with_images["image"].numpy(), decoding.decode_batch(list(without["image"])))


def test_a_bad_image_in_a_tfrecord_names_the_file_offset_and_feature(tmp_path):
    from torchestimator.data import FixedLenFeature, TFRecordDataset, TFRecordWriter, encode_example

    path = tmp_path / "bad.tfrecord"
    records = [
        encode_example({"image": [data]}, kinds={"image": "bytes"})
        for data in ((FIXTURES / "rgb.png").read_bytes(), b"not an image")
    ]
    with TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    features = {"image": FixedLenFeature([], "string")}
    offset = 16 + len(records[0])
    for batch_size in (2, None):
        dataset = TFRecordDataset(
            str(path), features=features, images={"image": ImageDecoding(size=(2, 2))}, batch_size=batch_size
        )
        with pytest.raises(ImageDecodeError, match=rf"^{path}: record at offset {offset}, feature 'image': unknown"):
            list(dataset)
    buffered = TFRecordDataset(
        str(path),
        features=features,
        images={"image": ImageDecoding(size=(2, 2))},
        batch_size=2,
        shuffle_buffer_size=2,
        seed=0,
    )
    with pytest.raises(ImageDecodeError, match=r"^TFRecordDataset shard 0, epoch 0: record [01] of the shard's epoch"):
        list(buffered)


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        (
            {"images": {"image": ImageDecoding(size=(2, 2))}},
            ValueError,
            r"images= decodes features that features= parses",
        ),
        ({"images": {}, "with_features": True}, TypeError, r"images must be a non-empty mapping of feature name"),
        (
            {"images": {"label": ImageDecoding(size=(2, 2))}, "with_features": True},
            ValueError,
            r"images\['label'\] needs features\['label'\] to be FixedLenFeature\(\[\], \"string\"\)",
        ),
        (
            {"images": {"image": (2, 2)}, "with_features": True},
            TypeError,
            r"images\['image'\] must be an ImageDecoding",
        ),
    ],
)
def test_tfrecord_dataset_refuses_images_it_cannot_decode(tmp_path, options, error, pattern):
    from torchestimator.data import FixedLenFeature, TFRecordDataset

    path, _ = _image_records(tmp_path, ["rgb.png"])
    if options.pop("with_features", False):
        options["features"] = {"image": FixedLenFeature([], "string"), "label": FixedLenFeature([], "int64")}
    with pytest.raises(error, match=pattern):
        TFRecordDataset(str(path), **options)


def test_the_decode_benchmark_runs_checks_and_prints_its_ratio_line(capsys):
    import importlib.util

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "image_decode.py"
    spec = importlib.util.spec_from_file_location("image_decode_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    assert benchmark.main(["--quick"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("image_decode jpeg_vs_pillow=") and " png_vs_pillow=" in last
    figures = dict(item.split("=") for item in last.split()[1:])
    assert float(figures["png_vs_pillow"]) > 0 and (
        figures["jpeg_vs_pillow"] == "n/a" or float(figures["jpeg_vs_pillow"]) > 0
    )


def test_damaged_bytes_raise_image_decode_error_and_nothing_else():
    """Seeded mutations of every fixture (flipped bytes, cuts, insertions): decoded, or ImageDecodeError."""
    import warnings

    rng = np.random.default_rng(15)
    originals = [
        path.read_bytes() for path in sorted(FIXTURES.iterdir()) if path.suffix in (".png", ".jpg", ".gif", ".bmp")
    ]
    decoding = ImageDecoding(size=(5, 5))
    calls = (
        decode_image,
        lambda data: decode_png(data, channels=1),
        decoding.decode,
        lambda data: decode_jpeg(data, dct_method="INTEGER_ACCURATE"),
    )
    refused = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's DecompressionBombWarning on a mutated size
        for _ in range(300):
            data = bytearray(originals[rng.integers(len(originals))])
            position = int(rng.integers(len(data)))
            kind = rng.integers(3)
            if kind == 0:
                data[position] = int(rng.integers(256))
            elif kind == 1:
                del data[max(position, 1) :]
            else:
                data[position:position] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
            for call in calls:
                try:
                    call(bytes(data))
                except ImageDecodeError:
                    refused += 1
    assert refused > 300  # the mutations did reach the error paths


def test_bytes_claiming_a_huge_image_are_refused_before_decoding():
    import struct
    import zlib

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)

    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(64))) + chunk(b"IEND", b"")
    with pytest.raises(ImageDecodeError, match=r"^big\.png: the PNG image is too large to decode .*images\.MAX_PIXELS"):
        decode_image(png, where="big.png")
    jpeg = bytearray((FIXTURES / "photo420.jpg").read_bytes())
    start = jpeg.index(b"\xff\xc0") + 5  # SOF0: precision, then height and width
    jpeg[start : start + 4] = struct.pack(">HH", 60_000, 60_000)
    with pytest.raises(ImageDecodeError, match=r"the JPEG image is too large to decode"):
        decode_image(bytes(jpeg))
