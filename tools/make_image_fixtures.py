"""Writes tests/fixtures/images/: small PNG/JPEG/GIF files and TensorFlow's decoded and resized outputs.

Run with the comparison environment (tensorflow-cpu 2.21, Pillow; see benchmarks/requirements-bench.txt):

    python tools/make_image_fixtures.py [tests/fixtures/images]

Every image is made here from a fixed seed (Pillow writes the 8-bit PNGs, JPEGs and GIFs; the 16-bit
RGB/RGBA/gray+alpha PNGs, which Pillow cannot write, are encoded below with every PNG row filter), then
decoded by tf.io.decode_image / decode_png / decode_jpeg with each channels/dtype/dct_method TF accepts for
its format, and resized by tf.image.resize with each method. expected.npz holds the outputs under
"<file>|<op>|<channels>|<dtype or dct_method>" and "resize|<method>|<height>x<width>" (input "resize|input").
"""

from __future__ import annotations

import io
import os
import struct
import sys
import zlib

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _photo(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth colour fields plus noise: JPEG's DCT choices show on it as on a photo."""
    yy, xx = np.mgrid[:height, :width]
    image = np.stack([128 + 90 * np.sin(xx / 5.0), 60 + yy * 4.0, 200 - 70 * np.cos((xx + yy) / 7.0)], -1)
    return np.clip(image + rng.normal(0, 10, image.shape), 0, 255).astype(np.uint8)


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _filtered_rows(pixels: np.ndarray) -> bytes:
    """[h, w, c] uint8/uint16 as PNG scanlines, rows filtered in turn with None, Sub, Up, Average and Paeth."""
    height, _, channels = pixels.shape
    bpp = pixels.dtype.itemsize * channels
    rows = [pixels[y].astype(pixels.dtype.newbyteorder(">")).tobytes() for y in range(height)]
    out, previous = [], bytes(len(rows[0]) if rows else 0)
    for y, row in enumerate(rows):
        kind = y % 5
        raw, prior = np.frombuffer(row, np.uint8).astype(np.int32), np.frombuffer(previous, np.uint8).astype(np.int32)
        left = np.concatenate([np.zeros(bpp, np.int32), raw[:-bpp]])
        upper_left = np.concatenate([np.zeros(bpp, np.int32), prior[:-bpp]])
        if kind == 0:
            predictor = np.zeros_like(raw)
        elif kind == 1:
            predictor = left
        elif kind == 2:
            predictor = prior
        elif kind == 3:
            predictor = (left + prior) // 2
        else:
            p = left + prior - upper_left
            pa, pb, pc = np.abs(p - left), np.abs(p - prior), np.abs(p - upper_left)
            predictor = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prior, upper_left))
        out.append(bytes([kind]) + ((raw - predictor) % 256).astype(np.uint8).tobytes())
        previous = row
    return b"".join(out)


def _png16(pixels: np.ndarray, interlaced: bool = False) -> bytes:
    """A PNG of [H, W, C] uint16 (16-bit) or uint8 (8-bit), written here; Adam7-interlaced if asked."""
    height, width, channels = pixels.shape
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    if interlaced:
        passes = [pixels[y0::dy, x0::dx] for x0, y0, dx, dy in _ADAM7]
        data = b"".join(_filtered_rows(part) for part in passes if part.size)
    else:
        data = _filtered_rows(pixels)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", width, height, 8 * pixels.dtype.itemsize, color_type, 0, 0, int(interlaced))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(data, 9)) + chunk(b"IEND", b"")


def _top_down(bmp: bytes) -> bytes:
    """The same 24-bit BMP with a negative height: rows stored top row first."""
    offset, width, height = struct.unpack_from("<i", bmp, 10)[0], *struct.unpack_from("<ii", bmp, 18)
    row_size = (3 * width + 3) // 4 * 4
    rows = [bmp[offset + index * row_size : offset + (index + 1) * row_size] for index in range(height)]
    return bmp[:22] + struct.pack("<i", -height) + bmp[26:offset] + b"".join(reversed(rows))


def _saved(image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def make_images() -> dict[str, bytes]:
    from PIL import Image

    rng = np.random.default_rng(20260515)
    rgb = _photo(rng, 6, 8)
    rgba = np.concatenate([rgb, rng.integers(0, 256, (6, 8, 1), dtype=np.uint8)], -1)
    gray = rgb[..., 1].copy()
    photo = _photo(rng, 24, 40)
    files = {
        "gray.png": _saved(Image.fromarray(gray), "PNG"),
        "gray_alpha.png": _saved(Image.fromarray(rgba[..., 1::2], "LA"), "PNG"),
        "rgb.png": _saved(Image.fromarray(rgb), "PNG"),
        "rgba.png": _saved(Image.fromarray(rgba, "RGBA"), "PNG"),
        "palette.png": _saved(Image.fromarray(rgb).quantize(12), "PNG"),
        "palette_trns.png": _saved(Image.fromarray(rgb).quantize(12), "PNG", transparency=0),
        "gray_trns.png": _saved(Image.fromarray(gray), "PNG", transparency=int(gray[0, 0])),
        "rgb_trns.png": _saved(Image.fromarray(rgb), "PNG", transparency=tuple(int(v) for v in rgb[0, 0])),
        "bilevel.png": _saved(Image.fromarray(gray > 128), "PNG"),
        "gray16.png": _png16(rng.integers(0, 65536, (6, 8, 1), dtype=np.uint16)),
        "gray_alpha16.png": _png16(rng.integers(0, 65536, (6, 8, 2), dtype=np.uint16)),
        "rgb16.png": _png16(rng.integers(0, 65536, (6, 8, 3), dtype=np.uint16)),
        "rgba16.png": _png16(rng.integers(0, 65536, (6, 8, 4), dtype=np.uint16)),
        "rgb16_interlaced.png": _png16(rng.integers(0, 65536, (11, 13, 3), dtype=np.uint16), interlaced=True),
        "gray_alpha16_interlaced.png": _png16(rng.integers(0, 65536, (9, 10, 2), dtype=np.uint16), interlaced=True),
        "rgb_interlaced.png": _png16(rng.integers(0, 256, (11, 13, 3), dtype=np.uint8), interlaced=True),
    }
    files["photo420.jpg"] = _saved(Image.fromarray(photo), "JPEG", quality=85, subsampling=2)
    files["photo444.jpg"] = _saved(Image.fromarray(photo[:21, :27]), "JPEG", quality=85, subsampling=0)
    files["photo422.jpg"] = _saved(Image.fromarray(photo[:17, :30]), "JPEG", quality=85, subsampling=1)
    files["gray.jpg"] = _saved(Image.fromarray(photo[..., 0]), "JPEG", quality=85)
    files["rgb.bmp"] = _saved(Image.fromarray(photo[:5, :7]), "BMP")  # 21-byte rows padded to 24
    files["rgba.bmp"] = _saved(Image.fromarray(rgba[:5, :7], "RGBA"), "BMP")  # 32-bit, BGRA
    files["palette.bmp"] = _saved(Image.fromarray(photo[:5, :7]).quantize(12), "BMP")  # TF: the raw indices
    files["top_down.bmp"] = _top_down(files["rgb.bmp"])
    frames = [Image.fromarray(_photo(rng, 6, 8)).quantize(16) for _ in range(3)]
    files["animated.gif"] = _saved(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    files["still.gif"] = _saved(frames[0], "GIF")
    return files


def expected_outputs(files: dict[str, bytes]) -> dict[str, np.ndarray]:
    import tensorflow as tf

    out: dict[str, np.ndarray] = {}
    for name, data in files.items():
        if name.endswith(".png"):
            for channels in (0, 1, 3, 4):
                for dtype in ("uint8", "uint16"):
                    out[f"{name}|decode_png|{channels}|{dtype}"] = tf.io.decode_png(data, channels, dtype).numpy()
                if channels in (0, 4):  # float32 is the uint16 image scaled: two channel counts show it
                    out[f"{name}|decode_image|{channels}|float32"] = tf.io.decode_image(
                        data, channels, tf.float32
                    ).numpy()
            out[f"{name}|decode_jpeg|0|"] = tf.io.decode_jpeg(data).numpy()
        elif name.endswith(".jpg"):
            for channels in (0, 1, 3):
                for dct in ("", "INTEGER_ACCURATE"):
                    out[f"{name}|decode_jpeg|{channels}|{dct}"] = tf.io.decode_jpeg(
                        data, channels, dct_method=dct
                    ).numpy()
            for dtype in ("uint8", "uint16", "float32"):
                out[f"{name}|decode_image|0|{dtype}"] = tf.io.decode_image(data, 0, getattr(tf, dtype)).numpy()
            for dtype in ("uint8", "uint16"):  # decode_png takes JPEGs too ("the interface is the same")
                out[f"{name}|decode_png|0|{dtype}"] = tf.io.decode_png(data, dtype=getattr(tf, dtype)).numpy()
        elif name.endswith(".bmp"):
            for channels in (0, 3, 4):
                out[f"{name}|decode_image|{channels}|uint8"] = tf.io.decode_image(data, channels).numpy()
            if name != "top_down.bmp":  # TF's float/uint16 path sizes its buffer by the signed height
                for dtype in ("uint16", "float32"):
                    out[f"{name}|decode_image|0|{dtype}"] = tf.io.decode_image(data, 0, getattr(tf, dtype)).numpy()
        else:
            for channels in (0, 3):
                for dtype in ("uint8", "uint16", "float32"):
                    out[f"{name}|decode_image|{channels}|{dtype}"] = tf.io.decode_image(
                        data, channels, getattr(tf, dtype)
                    ).numpy()
            out[f"{name}|decode_image_first|0|uint8"] = tf.io.decode_image(data, expand_animations=False).numpy()
            if name == "still.gif":  # decode_png/decode_jpeg take a one-frame GIF
                out[f"{name}|decode_png|0|uint16"] = tf.io.decode_png(data, dtype=tf.uint16).numpy()
                out[f"{name}|decode_jpeg|3|"] = tf.io.decode_jpeg(data, channels=3).numpy()
    return out


def expected_resizes() -> dict[str, np.ndarray]:
    import tensorflow as tf

    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    out = {"resize|input": image}
    for method in ("bilinear", "nearest", "bicubic", "area"):
        for height, width in ((4, 5), (20, 23), (9, 11), (3, 30)):
            resized = tf.image.resize(image, (height, width), method=method).numpy()
            out[f"resize|{method}|{height}x{width}"] = resized.astype(np.float32)
    return out


def main(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    files = make_images()
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as file:
            file.write(data)
    arrays = {**expected_outputs(files), **expected_resizes()}
    np.savez_compressed(os.path.join(folder, "expected.npz"), **arrays)
    import tensorflow as tf

    print(f"wrote {len(files)} images and {len(arrays)} arrays (TensorFlow {tf.__version__}) to {folder}")


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "images")
    )
