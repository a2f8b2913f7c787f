"""Benchmark: decoding JPEG and PNG bytes, the decoder data/images.py uses against Pillow, in the same run.

Images are generated here (seeded): photo-like content (sklearn's digits upscaled, smooth colour fields and
noise; a gradient field without scikit-learn) at 224x224 and 640x480, saved by Pillow as JPEG (quality 90,
4:2:0) and PNG. Each decoder decodes every image once per round into an [H, W, 3] uint8 numpy array; rounds
are interleaved in rotating order, the first dropped as warm-up; a figure is the median over rounds of
images per wall-clock second, a ratio the median over rounds of ours / Pillow's within the same round.

Decoders timed:
- pillow: `np.asarray(Image.open(BytesIO(data)))`, the anchor (libjpeg-turbo inside Pillow, ISLOW DCT);
- simplejpeg: `simplejpeg.decode_jpeg(data, fastdct=True)` (libjpeg-turbo, IFAST: TF's default DCT), and
  with fastdct=False (ISLOW, TF's INTEGER_ACCURATE), when installed;
- opencv: `cv2.imdecode` (BGR, as OpenCV gives it), when installed (not a dependency; for comparison);
- ours: `torchestimator.data.images.decode_image(data)`, what the converter, the dataset and the image
  receiver run (simplejpeg for JPEG when installed, Pillow for PNG).

Before timing, ours is checked against the decoder it should equal (simplejpeg fastdct, else Pillow) on every
image; the script exits 1 otherwise.

Run:  python benchmarks/image_decode.py [--rounds R] [--images N] [--quick]
Last line:  image_decode jpeg_vs_pillow=<ours/pillow, JPEG, all sizes> png_vs_pillow=<ours/pillow, PNG>
    jpeg224_vs_pillow=<ratio> jpeg640_vs_pillow=<ratio> simplejpeg_accurate_vs_pillow=<ratio>
    opencv_jpeg_vs_pillow=<ratio or n/a>
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

SIZES = ((224, 224), (480, 640))


def _photos(count: int, height: int, width: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    try:
        from sklearn.datasets import load_digits

        digits = load_digits().images
    except ImportError:
        digits = np.linspace(0, 16, 64).reshape(1, 8, 8) * np.ones((10, 1, 1))
    yy, xx = np.mgrid[:height, :width]
    photos = []
    for _ in range(count):
        digit = digits[rng.integers(len(digits))]
        base = np.kron(digit, np.ones((height // 8 + 1, width // 8 + 1)))[:height, :width]
        phase = rng.uniform(0, 6.28, 3)
        image = np.stack(
            [
                base * 12 + 60 * np.sin(xx / 23 + phase[0]) + 80,
                base * 8 + 50 * np.cos(yy / 31 + phase[1]) + 90,
                200 - base * 10 + 40 * np.sin((xx + yy) / 41 + phase[2]),
            ],
            -1,
        )
        photos.append(np.clip(image + rng.normal(0, 8, image.shape), 0, 255).astype(np.uint8))
    return photos


def _encoded(photos: list[np.ndarray], fmt: str) -> list[bytes]:
    from PIL import Image

    out = []
    for photo in photos:
        buffer = io.BytesIO()
        options = {"quality": 90, "subsampling": 2} if fmt == "JPEG" else {"compress_level": 6}
        Image.fromarray(photo).save(buffer, fmt, **options)
        out.append(buffer.getvalue())
    return out


def _decoders() -> dict[str, Callable[[bytes], np.ndarray]]:
    from PIL import Image

    from torchestimator.data.images import decode_image

    decoders: dict[str, Callable[[bytes], np.ndarray]] = {
        "pillow": lambda data: np.asarray(Image.open(io.BytesIO(data))),  # RGB files: no conversion needed
        "ours": decode_image,
    }
    try:
        import simplejpeg

        decoders["simplejpeg"] = lambda data: simplejpeg.decode_jpeg(data, fastdct=True)
        decoders["simplejpeg_accurate"] = lambda data: simplejpeg.decode_jpeg(data, fastdct=False)
    except ImportError:
        pass
    try:
        import cv2

        decoders["opencv"] = lambda data: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except ImportError:
        pass
    return decoders


def _check(decoders: dict[str, Callable[[bytes], np.ndarray]], sets: dict[str, list[bytes]]) -> bool:
    for name, images in sets.items():
        reference = (
            decoders["simplejpeg"] if name.startswith("jpeg") and "simplejpeg" in decoders else decoders["pillow"]
        )
        for data in images:
            if not np.array_equal(decoders["ours"](data), reference(data)):
                print(f"error: decode_image differs from its reference decoder on a {name} image", file=sys.stderr)
                return False
    return True


def _rate(decode: Callable[[bytes], np.ndarray], images: list[bytes]) -> float:
    start = time.perf_counter()
    for data in images:
        decode(data)
    return len(images) / (time.perf_counter() - start)


def _measure(
    decoders: dict[str, Callable[[bytes], np.ndarray]], sets: dict[str, list[bytes]], rounds: int
) -> dict[tuple[str, str], list[float]]:
    rates: dict[tuple[str, str], list[float]] = {}
    names = list(decoders)
    for round_index in range(rounds + 1):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for set_name, images in sets.items():
            for decoder in order:
                if (
                    decoder.startswith(("simplejpeg", "opencv"))
                    and not set_name.startswith("jpeg")
                    and decoder != "opencv"
                ):
                    continue
                rate = _rate(decoders[decoder], images)
                if round_index:  # the first round warms caches and code paths
                    rates.setdefault((set_name, decoder), []).append(rate)
    return rates


def _ratio(rates: dict[tuple[str, str], list[float]], sets: Sequence[str], decoder: str) -> float | None:
    """Median over rounds of (decoder / pillow), each round's ratio over the sets' summed time."""
    if any((name, decoder) not in rates for name in sets):
        return None
    rounds = len(rates[(sets[0], "pillow")])
    per_round = []
    for index in range(rounds):
        ours = sum(1 / rates[(name, decoder)][index] for name in sets)
        pillow = sum(1 / rates[(name, "pillow")][index] for name in sets)
        per_round.append(pillow / ours)
    return statistics.median(per_round)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up (default 5)")
    parser.add_argument("--images", type=int, default=40, help="images per size and format (default 40)")
    parser.add_argument("--quick", action="store_true", help="few images and rounds, for a smoke test")
    args = parser.parse_args(argv)
    rounds, count = (2, 4) if args.quick else (args.rounds, args.images)
    sets: dict[str, list[bytes]] = {}
    for height, width in SIZES:
        photos = _photos(count, height, width, seed=height)
        sets[f"jpeg{width}"] = _encoded(photos, "JPEG")
        sets[f"png{width}"] = _encoded(photos, "PNG")
    decoders = _decoders()
    if not _check(decoders, sets):
        return 1
    rates = _measure(decoders, sets, rounds)
    for (set_name, decoder), values in sorted(rates.items()):
        print(f"{set_name:8s} {decoder:20s} {statistics.median(values):9.1f} images/s")
    jpeg_sets, png_sets = [name for name in sets if name.startswith("jpeg")], [n for n in sets if n.startswith("png")]

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    print(
        f"image_decode jpeg_vs_pillow={shown(_ratio(rates, jpeg_sets, 'ours'))} "
        f"png_vs_pillow={shown(_ratio(rates, png_sets, 'ours'))} "
        f"jpeg224_vs_pillow={shown(_ratio(rates, ['jpeg224'], 'ours'))} "
        f"jpeg640_vs_pillow={shown(_ratio(rates, ['jpeg640'], 'ours'))} "
        f"simplejpeg_accurate_vs_pillow={shown(_ratio(rates, jpeg_sets, 'simplejpeg_accurate'))} "
        f"opencv_jpeg_vs_pillow={shown(_ratio(rates, jpeg_sets, 'opencv'))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
