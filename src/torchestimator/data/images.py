"""Image decoding and resizing with TensorFlow 2.21's semantics, and ImageDecoding: one declared decode step.

What belongs here: decode_image / decode_png / decode_jpeg (TF's
tf.io.decode_* rules: channels, dtype, animations), resize_image
(tf.image.resize, antialias=False; kernels in `_image_resize.py`) and
`ImageDecoding`, the frozen description of "decode, resize, scale, lay out"
that the converter, TFRecordDataset, an input_fn and the exported image
receiver all run, so a served model sees the pixels training saw. What does
not: reading files or records (callers pass bytes and a `where` naming them).

The rules, each checked against tf.io in tests/test_images.py with fixtures
made by TensorFlow 2.21 (tests/fixtures/images/README.md):

- channels=0 keeps the file's channels: gray 1, gray+alpha 2, RGB 3, RGBA 4;
  a palette PNG gives 3, or 4 when it has a tRNS chunk; a tRNS chunk on a gray
  or RGB PNG counts only with channels=4 (its colour gets alpha 0). An alpha
  channels=4 adds is (1 << the file's bit depth) - 1: 255 for 8-bit files,
  but 1 for a 1-bit gray and 15 for a 4-bit palette PNG (TF's quirk: it hands
  libpng's add_alpha the file's depth). channels=1 from RGB(A) is
  libpng's rgb_to_gray: (9797 R + 19234 G + 3737 B) >> 15 for 8-bit samples,
  (... + 16384) >> 15 for 16-bit ones (not Pillow's "L" weights), alpha
  dropped; 1 from gray+alpha drops alpha; 3 repeats gray, drops alpha; 4 adds
  an opaque alpha. A colour JPEG with channels=1 gives its luma (Y) plane, as
  libjpeg does. JPEG takes channels 0, 1, 3; GIF 0, 3; PNG 0, 1, 3, 4.
- 16-bit PNGs (every colour type): dtype="uint16" keeps all 16 bits;
  dtype="uint8" keeps the high byte (v >> 8, libpng's strip_16). An 8-bit
  PNG read as uint16 is scaled by 257, a JPEG or GIF by 256 (TF's
  convert_image_dtype shift). decode_image(dtype="float32") is the uint16
  image times float32(1/65535) for PNG (TF's kernel goes through uint16: 8-bit
  v becomes 257 v / 65535, one ulp off v / 255 at powers of two), and the
  uint8 image times float32(1/255) for JPEG, GIF and BMP.
- GIF: decode_image gives [frames, H, W, 3] (also for one frame); with
  expand_animations=False, and in decode_png/decode_jpeg, the first frame as
  [H, W, 3] (TF refuses an animated GIF there; so do we).
- BMP (decode_image only, as TF): uncompressed 8/24/32-bit, read as TF's own
  reader does, an 8-bit file's palette indices included (`_bmp`); channels 0,
  3 or 4. WebP is refused with an ImageDecodeError.
- decode_png and decode_jpeg accept any of PNG, JPEG and one-frame GIF, as TF's
  ops do ("the interface is the same").

JPEG and the DCT. TF's dct_method "" (its default) is libjpeg's INTEGER_FAST
(JDCT_IFAST); "INTEGER_ACCURATE" is JDCT_ISLOW. Both use libjpeg's fancy
upsampling. When simplejpeg (libjpeg-turbo, in the `images` extra) is
installed, JPEGs decode through it with fastdct matching the method: equal to
TF for both, every pixel, on 4:2:0, 4:2:2, 4:4:4 and grayscale files. Pillow
has no IFAST option: without simplejpeg, dct_method "" decodes as
INTEGER_ACCURATE (identical to TF's INTEGER_ACCURATE; against TF's default
60-70 % of the values differ: by at most 6 levels in 0..255 on the quality-85
fixtures, by up to 15 and 18 on scikit-learn's two sample photos, china.jpg
and flower.jpg), with one warning per process. simplejpeg is also about 1.3x Pillow's speed on JPEGs
(benchmarks/image_decode.py: 224x224 and 640x480, one core). CMYK/YCCK JPEGs are refused.

resize_image returns float32 as tf.image.resize does (also for nearest, where
TF keeps the input dtype: the values are the same). bilinear and nearest are
TF's values bit for bit; bicubic and area within float32 rounding (a few
ulps: < 1e-4 on 0..255 pixel values) because TF sums in another order.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from torchestimator._extras import import_extra
from torchestimator.data import _image_resize
from torchestimator.errors import ConfigError, ConfigTypeError, ImageDecodeError

logger = logging.getLogger(__name__)

__all__ = ["ImageDecodeError", "ImageDecoding", "decode_image", "decode_jpeg", "decode_png", "resize_image"]

DCT_METHODS = ("", "INTEGER_FAST", "INTEGER_ACCURATE")
RESIZE_METHODS = tuple(_image_resize.KERNELS)
LAYOUTS = ("HWC", "CHW")
_DTYPES = ("uint8", "uint16", "float32")
_GRAY = {8: (9797, 19234, 3737, 0), 16: (9797, 19234, 3737, 16384)}  # libpng's rgb_to_gray as TF sets it
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PIXELS = 2 * 89_478_485
"""The most pixels (all of a GIF's frames together) one image may decode to: Pillow's decompression-bomb
limit, applied to the JPEG decoder and GIF frames too, so bytes that claim a huge image are refused before
memory is taken (TF has no such bound)."""
_warned_accurate_fallback = False


# --------------------------------------------------------------------------- formats and errors


def sniff_format(contents: bytes) -> str:
    """The format of encoded image bytes by their magic number, as TF classifies them (JPEG first)."""
    if contents.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if contents.startswith(_PNG_SIGNATURE):
        return "png"
    if contents.startswith(b"GIF8"):
        return "gif"
    if contents.startswith(b"BM"):
        return "bmp"
    if contents[:4] == b"RIFF" and len(contents) > 12 and contents[8:12] == b"WEBP":
        return "webp"
    return "unknown"


def _where(where: str | None) -> str:
    return where or "image"


def _error(where: str | None, fmt: str, what: str) -> ImageDecodeError:
    return ImageDecodeError(f"{_where(where)}: {what}", where=_where(where), format=fmt)


def _as_bytes(contents: Any, where: str | None) -> bytes:
    if isinstance(contents, (bytes, bytearray, memoryview)):
        return bytes(contents)
    if isinstance(contents, np.bytes_):
        return bytes(contents)
    raise _error(where, "unknown", f"expected the encoded image as bytes; received {type(contents).__name__}.")


def _check_channels(channels: Any, allowed: Sequence[int], fmt: str, where: str | None) -> int:
    if isinstance(channels, bool) or not isinstance(channels, (int, np.integer)) or channels not in allowed:
        raise _error(where, fmt, f"channels must be one of {list(allowed)} for {fmt.upper()}; received {channels!r}.")
    return int(channels)


def _pillow() -> Any:
    return import_extra("PIL.Image", extra="images", feature="decoding images")


def _simplejpeg() -> Any | None:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


# --------------------------------------------------------------------------- channel and depth rules


def _to_gray(pixels: np.ndarray) -> np.ndarray:
    """libpng's rgb_to_gray on [H, W, 3|4] (alpha dropped), at the samples' own depth."""
    red_weight, green_weight, blue_weight, rounding = _GRAY[16 if pixels.dtype == np.uint16 else 8]
    rgb = pixels[..., :3].astype(np.uint32)
    gray = (red_weight * rgb[..., 0] + green_weight * rgb[..., 1] + blue_weight * rgb[..., 2] + rounding) >> 15
    return gray.astype(pixels.dtype)[..., None]


def _convert_channels(pixels: np.ndarray, channels: int) -> np.ndarray:
    """[H, W, c] to [H, W, channels] by TF's (libpng's) rules; channels=0 keeps c."""
    have = pixels.shape[-1]
    if channels in (0, have):
        return pixels
    opaque = np.full(pixels.shape[:-1] + (1,), np.iinfo(pixels.dtype).max, dtype=pixels.dtype)
    gray = pixels[..., :1]
    if channels == 1:
        return gray if have <= 2 else _to_gray(pixels)
    if channels == 3:
        return np.repeat(gray, 3, axis=-1) if have <= 2 else pixels[..., :3]
    # channels == 4
    if have == 1:
        return np.concatenate([np.repeat(gray, 3, axis=-1), opaque], axis=-1)
    if have == 2:
        return np.concatenate([np.repeat(gray, 3, axis=-1), pixels[..., 1:2]], axis=-1)
    return np.concatenate([pixels, opaque], axis=-1)


def _to_depth(pixels: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "uint8" and pixels.dtype == np.uint16:
        return (pixels >> 8).astype(np.uint8)  # libpng's strip_16: the high byte
    if dtype == "uint16" and pixels.dtype == np.uint8:
        return pixels.astype(np.uint16) * np.uint16(257)
    return pixels


# --------------------------------------------------------------------------- PNG


def _png_header(contents: bytes, where: str | None) -> tuple[int, int]:
    """(bit depth, colour type) from IHDR."""
    if len(contents) < 33 or contents[12:16] != b"IHDR":
        raise _error(where, "png", "not a PNG file: its IHDR chunk is missing or cut short.")
    return contents[24], contents[25]


def _pillow_open(contents: bytes, fmt: str, where: str | None, low_bytes: bool = False) -> Any:
    """The loaded Pillow image; `low_bytes`: a 16-bit RGB(A) PNG's low bytes (";16L" reads them from big-endian)."""
    image_module = _pillow()
    try:
        image = image_module.open(io.BytesIO(contents), formats=[fmt.upper()])
        if low_bytes:
            image.tile = [tile._replace(args=tile.args.replace(";16B", ";16L")) for tile in image.tile]
        image.load()
    except image_module.DecompressionBombError as error:
        raise _too_large(where, fmt, str(error)) from None
    except (
        image_module.UnidentifiedImageError,
        OSError,
        SyntaxError,
        ValueError,
        EOFError,
        zlib.error,
        struct.error,
    ) as error:
        raise _error(
            where,
            fmt,
            f"the {fmt.upper()} data cannot be decoded ({' '.join(str(error).split())}); "
            f"the bytes are damaged or cut short.",
        ) from None
    return image


def _too_large(where: str | None, fmt: str, size: str) -> ImageDecodeError:
    return _error(
        where,
        fmt,
        f"the {fmt.upper()} image is too large to decode ({' '.join(size.split())}); "
        f"the limit is {MAX_PIXELS} pixels (images.MAX_PIXELS).",
    )


def _png_transparent_color(contents: bytes, color_type: int, bit_depth: int) -> tuple[int, ...] | None:
    """A gray or RGB PNG's tRNS colour, scaled as libpng expands low-bit gray to 8 bits (None: no tRNS)."""
    if color_type not in (0, 2):
        return None
    position = 8
    while position + 8 <= len(contents):
        length, kind = struct.unpack(">I4s", contents[position : position + 8])
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"tRNS" and length == (2 if color_type == 0 else 6):
            values = struct.unpack(f">{length // 2}H", contents[position + 8 : position + 8 + length])
            factor = 255 // ((1 << bit_depth) - 1) if bit_depth < 8 else 1
            return tuple(value * factor for value in values)
        position += 12 + length
    return None


def _png_for_channels(contents: bytes, channels: int, where: str | None) -> np.ndarray:
    """[H, W, channels] at the file's depth, by TF's (libpng's) rules, quirks included.

    With channels=4, a gray or RGB PNG's tRNS colour becomes alpha 0 (TF ignores it otherwise), and an
    added alpha is (1 << bit depth) - 1 of the file: 1 for a 1-bit gray, 15 for a 4-bit palette (TF hands
    libpng's png_set_add_alpha the file's depth).
    """
    bit_depth, color_type = _png_header(contents, where)
    native = _png_native(contents, bit_depth, color_type, where)
    if channels != 4 or native.shape[-1] in (2, 4):
        return _convert_channels(native, channels)
    opaque = np.iinfo(native.dtype).max if bit_depth >= 8 else (1 << bit_depth) - 1
    alpha = np.full(native.shape[:-1], opaque, dtype=native.dtype)
    transparent = _png_transparent_color(contents, color_type, bit_depth)
    if transparent is not None and len(transparent) == native.shape[-1]:
        alpha[np.all(native == np.asarray(transparent, dtype=native.dtype), axis=-1)] = 0
        alpha[alpha != 0] = np.iinfo(native.dtype).max
    color = native if native.shape[-1] == 3 else np.repeat(native, 3, axis=-1)
    return np.concatenate([color, alpha[..., None]], axis=-1)


def _png_native(contents: bytes, bit_depth: int, color_type: int, where: str | None) -> np.ndarray:
    """[H, W, c] at the file's depth (uint8, or uint16 for 16-bit files), c as TF's channels=0 gives it."""
    if bit_depth == 16:
        return _png16(contents, color_type, where)
    image = _pillow_open(contents, "png", where)
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif image.mode == "1":
        image = image.convert("L")
    elif image.mode not in ("L", "LA", "RGB", "RGBA"):
        raise _error(
            where, "png", f"Pillow decoded this PNG as mode {image.mode!r}, which has no TF channel rule here."
        )
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[..., None] if pixels.ndim == 2 else pixels


def _png16(contents: bytes, color_type: int, where: str | None) -> np.ndarray:
    """A 16-bit PNG with all 16 bits: Pillow keeps them only for gray, so the other types are read twice."""
    if color_type == 0:  # gray: Pillow's I;16
        return np.asarray(_pillow_open(contents, "png", where), dtype=np.uint16)[..., None]
    if color_type == 4:  # gray+alpha: same bytes per pixel and per row as 8-bit RGBA, so read it as that
        header = struct.pack(">IIBBBBB", *struct.unpack(">II", contents[16:24]), 8, 6, *contents[26:29])
        patched = contents[:16] + header + struct.pack(">I", zlib.crc32(b"IHDR" + header)) + contents[33:]
        raw = np.asarray(_pillow_open(patched, "png", where), dtype=np.uint8).astype(np.uint16)
        return (raw[..., 0::2] << 8) | raw[..., 1::2]
    if color_type in (2, 6):  # RGB / RGBA: Pillow's ";16B" keeps the high bytes, ";16L" then the low ones
        high = _pillow_open(contents, "png", where)
        low = _pillow_open(contents, "png", where, low_bytes=True)
        return (np.asarray(high).astype(np.uint16) << 8) | np.asarray(low).astype(np.uint16)
    raise _error(where, "png", f"16-bit samples with PNG colour type {color_type} are not valid PNG.")


def decode_png(contents: bytes, *, channels: int = 0, dtype: str = "uint8", where: str | None = None) -> np.ndarray:
    """tf.io.decode_png: [H, W, channels] uint8 or uint16 (PNG, JPEG or a one-frame GIF accepted, as TF)."""
    contents = _as_bytes(contents, where)
    if dtype not in ("uint8", "uint16"):
        raise _error(
            where, sniff_format(contents), f'decode_png: dtype must be "uint8" or "uint16"; received {dtype!r}.'
        )
    fmt = sniff_format(contents)
    if fmt != "png":  # JPEG, GIF: 8-bit, to uint16 by convert_image_dtype's shift, as decode_image
        pixels = _decode_3d(contents, fmt, channels, "", where)
        return pixels.astype(np.uint16) << 8 if dtype == "uint16" else pixels
    channels = _check_channels(channels, (0, 1, 3, 4), "png", where)
    # libpng converts colour at the file's depth, then strips or expands to the wanted one.
    return np.ascontiguousarray(_to_depth(_png_for_channels(contents, channels, where), dtype))


# --------------------------------------------------------------------------- JPEG


def decode_jpeg(contents: bytes, *, channels: int = 0, dct_method: str = "", where: str | None = None) -> np.ndarray:
    """tf.io.decode_jpeg: [H, W, channels] uint8 (JPEG, PNG or a one-frame GIF accepted, as TF)."""
    contents = _as_bytes(contents, where)
    fmt = sniff_format(contents)
    if dct_method not in DCT_METHODS:
        raise _error(where, fmt, f"dct_method must be one of {list(DCT_METHODS)} (TF's); received {dct_method!r}.")
    if fmt != "jpeg":
        return _to_depth(_decode_3d(contents, fmt, channels, dct_method, where), "uint8")
    return _jpeg(contents, channels, dct_method, where)


def _jpeg(contents: bytes, channels: int, dct_method: str, where: str | None) -> np.ndarray:
    if channels == 4:
        raise _error(where, "jpeg", "JPEG does not support 4 channels (TF's words); pass channels 0, 1 or 3.")
    channels = _check_channels(channels, (0, 1, 3), "jpeg", where)
    simplejpeg = _simplejpeg()
    if simplejpeg is not None:
        return _jpeg_simplejpeg(simplejpeg, contents, channels, dct_method, where)
    if dct_method != "INTEGER_ACCURATE":
        _warn_accurate_fallback()
    return _jpeg_pillow(contents, channels, where)


def _warn_accurate_fallback() -> None:
    global _warned_accurate_fallback
    if not _warned_accurate_fallback:
        _warned_accurate_fallback = True
        logger.warning(
            "decode_jpeg: simplejpeg is not installed, so JPEGs decode through Pillow with "
            "dct_method INTEGER_ACCURATE, not TF's default INTEGER_FAST (most values differ, by up "
            "to ~20 levels on photos); pip install 'torchestimator[images]' for TF's exact pixels."
        )


def _jpeg_simplejpeg(simplejpeg: Any, contents: bytes, channels: int, dct_method: str, where: str | None) -> np.ndarray:
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(contents)
        if height * width > MAX_PIXELS:
            raise _too_large(where, "jpeg", f"{width}x{height} pixels")
        if colorspace not in ("Gray", "YCbCr", "RGB"):
            raise _error(
                where,
                "jpeg",
                f"{colorspace} JPEGs are not decoded here (TF converts them with "
                f"libjpeg's CMYK rules); convert the file to RGB first.",
            )
        gray = channels == 1 or (channels == 0 and colorspace == "Gray")
        pixels = simplejpeg.decode_jpeg(
            contents, colorspace="GRAY" if gray else "RGB", fastdct=dct_method != "INTEGER_ACCURATE", fastupsample=False
        )
    except ValueError as error:
        if isinstance(error, ImageDecodeError):
            raise
        raise _error(
            where,
            "jpeg",
            f"the JPEG data cannot be decoded ({' '.join(str(error).split())}); the bytes are damaged or cut short.",
        ) from None
    return pixels if pixels.ndim == 3 else pixels[..., None]


def _jpeg_pillow(contents: bytes, channels: int, where: str | None) -> np.ndarray:
    image_module = _pillow()
    try:
        image = image_module.open(io.BytesIO(contents), formats=["JPEG"])
        if image.mode not in ("L", "RGB"):
            raise _error(
                where,
                "jpeg",
                f"{image.mode} JPEGs are not decoded here (TF converts them with "
                f"libjpeg's CMYK rules); convert the file to RGB first.",
            )
        if channels == 1 and image.mode == "RGB":
            image.draft("L", image.size)  # libjpeg's own grayscale output: the Y plane, as TF's channels=1
        image.load()
    except image_module.DecompressionBombError as error:
        raise _too_large(where, "jpeg", str(error)) from None
    except (image_module.UnidentifiedImageError, OSError, SyntaxError, ValueError, struct.error) as error:
        if isinstance(error, ImageDecodeError):
            raise
        raise _error(
            where,
            "jpeg",
            f"the JPEG data cannot be decoded ({' '.join(str(error).split())}); the bytes are damaged or cut short.",
        ) from None
    pixels = np.asarray(image, dtype=np.uint8)
    pixels = pixels[..., None] if pixels.ndim == 2 else pixels
    return _convert_channels(pixels, channels)


# --------------------------------------------------------------------------- GIF and dispatch


def _gif_frames(contents: bytes, first_only: bool, where: str | None) -> np.ndarray:
    """[frames, H, W, 3] uint8, each frame composed over the previous as GIF players (and giflib) do."""
    image_module = _pillow()
    image = _pillow_open(contents, "gif", where)
    frames: list[np.ndarray] = []
    try:
        count = 1 if first_only else image.n_frames
        if count * image.width * image.height > MAX_PIXELS:
            raise _too_large(where, "gif", f"{count} frames of {image.width}x{image.height} pixels")
        for index in range(count):
            image.seek(index)
            frames.append(np.asarray(image.convert("RGB"), dtype=np.uint8))
            if frames[-1].shape != frames[0].shape:
                raise _error(
                    where,
                    "gif",
                    f"frame {index} is {frames[-1].shape[1]}x{frames[-1].shape[0]} "
                    f"pixels, frame 0 {frames[0].shape[1]}x{frames[0].shape[0]}: a frame "
                    f"reaches outside the GIF's screen.",
                )
    except ImageDecodeError:
        raise
    except image_module.DecompressionBombError as error:
        raise _too_large(where, "gif", str(error)) from None
    except (OSError, ValueError, EOFError, IndexError, struct.error) as error:
        raise _error(
            where,
            "gif",
            f"frame {len(frames)} of the GIF cannot be decoded "
            f"({' '.join(str(error).split()) or type(error).__name__}); the bytes are "
            f"damaged or cut short.",
        ) from None
    return np.stack(frames)


def _bmp(contents: bytes, channels: int, where: str | None) -> np.ndarray:
    """TF's BMP reader: uncompressed 8/24/32-bit rows, the header's data offset, no palette lookup.

    As tf.io.decode_bmp: the bits per pixel say the channels (8: one channel holding the raw palette
    indices, 24: BGR, 32: BGRA), rows are padded to 4 bytes and stored bottom-up unless the height is
    negative, and the file must end right after the last row. channels=1 is refused; 3 from 1 repeats,
    4 adds an opaque alpha, 3 from 4 drops it.
    """
    channels = _check_channels(channels, (0, 3, 4), "bmp", where)
    if len(contents) < 32:
        raise _error(where, "bmp", f"incomplete BMP: the header needs 32 bytes, there are {len(contents)}.")
    data_offset, width, height, bits = (
        struct.unpack_from("<i", contents, 10)[0],
        *struct.unpack_from("<ii", contents, 18),
        struct.unpack_from("<h", contents, 28)[0],
    )
    file_channels = int(bits / 8)  # C's division, truncating toward zero
    if file_channels not in (1, 3, 4):
        raise _error(where, "bmp", f"a BMP with {bits} bits per pixel; 8, 24 and 32 are decoded.")
    if width <= 0 or height == 0 or data_offset < 0:
        raise _error(
            where, "bmp", f"the BMP header is invalid (width {width}, height {height}, data offset {data_offset})."
        )
    rows = abs(height)
    if width * rows > MAX_PIXELS:
        raise _too_large(where, "bmp", f"{width}x{rows} pixels")
    row_size = (file_channels * width + 3) // 4 * 4
    if len(contents) - data_offset - row_size * rows != 0:
        raise _error(
            where,
            "bmp",
            f"the BMP is {len(contents)} bytes, its header says {data_offset} + "
            f"{rows} rows of {row_size}; the file is cut short or carries more.",
        )
    padded_rows = np.frombuffer(contents, np.uint8, count=row_size * rows, offset=data_offset).reshape(rows, row_size)
    pixels = padded_rows[:, : width * file_channels].reshape(rows, width, file_channels)
    if height > 0:
        pixels = pixels[::-1]  # bottom-up rows
    if file_channels > 1:
        pixels = pixels[..., [2, 1, 0, 3][:file_channels]]  # BGR(A) to RGB(A)
    wanted = channels or file_channels
    if wanted == file_channels:
        return np.ascontiguousarray(pixels)
    if wanted == 3:
        return np.ascontiguousarray(pixels[..., :3] if file_channels == 4 else np.repeat(pixels, 3, axis=-1))
    color = pixels if file_channels == 3 else np.repeat(pixels, 3, axis=-1)
    return np.concatenate([color, np.full((rows, width, 1), 255, np.uint8)], axis=-1)


def _decode_3d(contents: bytes, fmt: str, channels: int, dct_method: str, where: str | None) -> np.ndarray:
    """One [H, W, C] image of any format decode_png/decode_jpeg take: PNG at its depth, JPEG, a 1-frame GIF."""
    if fmt == "png":
        channels = _check_channels(channels, (0, 1, 3, 4), "png", where)
        return _png_for_channels(contents, channels, where)
    if fmt == "jpeg":
        return _jpeg(contents, channels, dct_method, where)
    if fmt == "gif":
        _check_channels(channels, (0, 3), "gif", where)
        frames = _gif_frames(contents, False, where)
        if len(frames) != 1:
            raise _error(
                where,
                "gif",
                f"got {len(frames)} frames, but an animated GIF can only be decoded by "
                f"decode_image (TF's rule); use decode_image.",
            )
        return frames[0]
    raise _unsupported(fmt, where)


def _unsupported(fmt: str, where: str | None) -> ImageDecodeError:
    if fmt == "bmp":
        return _error(
            where, fmt, "BMP bytes: decode_png and decode_jpeg do not decode BMP (TF's rule); use decode_image."
        )
    if fmt == "webp":
        return _error(where, fmt, "WEBP images are not decoded here (PNG, JPEG, GIF and BMP are); convert them to PNG.")
    return _error(
        where,
        fmt,
        "unknown image file format: one of PNG, JPEG, GIF or BMP is required (the bytes "
        "start with none of their signatures).",
    )


def decode_image(
    contents: bytes,
    *,
    channels: int = 0,
    dtype: str = "uint8",
    expand_animations: bool = True,
    where: str | None = None,
) -> np.ndarray:
    """tf.io.decode_image: [H, W, C] (or [frames, H, W, 3] for a GIF) as uint8, uint16 or float32 (see the module)."""
    contents = _as_bytes(contents, where)
    fmt = sniff_format(contents)
    if dtype not in _DTYPES:
        raise _error(where, fmt, f"dtype must be one of {list(_DTYPES)}; received {dtype!r}.")
    if fmt == "gif":
        _check_channels(channels, (0, 3), "gif", where)
        pixels = _gif_frames(contents, not expand_animations, where)
        pixels = pixels if expand_animations else pixels[0]
    elif fmt in ("png", "jpeg"):
        pixels = _decode_3d(contents, fmt, channels, "", where)
    elif fmt == "bmp":
        pixels = _bmp(contents, channels, where)
    else:
        raise _unsupported(fmt, where)
    if fmt == "png" and dtype != "uint8":
        pixels = _to_depth(pixels, "uint16")  # TF's PNG float path goes through uint16 (8-bit v: 257 v)
    if dtype == "float32":
        scale = np.float32(1 / 65535) if pixels.dtype == np.uint16 else np.float32(1 / 255)
        return pixels.astype(np.float32) * scale
    if dtype == "uint16" and pixels.dtype == np.uint8:  # JPEG, GIF, BMP: convert_image_dtype's shift, 256 v
        return pixels.astype(np.uint16) << 8
    return np.ascontiguousarray(_to_depth(pixels, dtype))


# --------------------------------------------------------------------------- resize


def resize_image(image: np.ndarray, size: tuple[int, int], *, method: str = "bilinear") -> np.ndarray:
    """tf.image.resize(image, size, method, antialias=False) on [H, W, C] or [N, H, W, C]: float32."""
    if method not in RESIZE_METHODS:
        raise ValueError(f"resize_image: method must be one of {list(RESIZE_METHODS)}; received {method!r}.")
    height, width = _checked_size(size, "resize_image: size")
    array = np.asarray(image)
    if array.ndim not in (3, 4) or 0 in array.shape:
        raise ValueError(
            f"resize_image: image must be [height, width, channels] or [batch, height, width, "
            f"channels] with no empty axis; received shape {list(array.shape)}."
        )
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise TypeError(f"resize_image: image must hold numbers; received dtype {array.dtype}.")
    batch = array.astype(np.float32)
    resized = _image_resize.KERNELS[method](batch if array.ndim == 4 else batch[None], height, width)
    return np.ascontiguousarray(resized if array.ndim == 4 else resized[0], dtype=np.float32)


def _checked_size(size: Any, what: str) -> tuple[int, int]:
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(side, (int, np.integer)) and not isinstance(side, bool) and side > 0 for side in size)
    ):
        raise ValueError(f"{what} must be (height, width), two integers > 0; received {size!r}.")
    return int(size[0]), int(size[1])


# --------------------------------------------------------------------------- ImageDecoding


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageDecoding:
    """Encoded bytes to the float32 image a model takes: decode, resize, scale, lay out.

    The one description an input_fn, TFRecordDataset(images=...), the converter and the exported image
    receiver share; `to_json`/`from_json` carry it into an export.
    """

    size: tuple[int, int]
    """(height, width) after tf.image.resize."""
    channels: int = 3
    """1, 3 or 4: decode_image's channels (TF's conversions)."""
    method: str = "bilinear"
    """tf.image.resize's method: bilinear, nearest, bicubic or area (antialias=False)."""
    layout: str = "HWC"
    """HWC (TF's) or CHW (torch's convolutions)."""
    scale: float | None = None
    """Multiplies the resized pixels (0..255) when set, e.g. 1/255."""
    dct_method: str = ""
    """JPEG's DCT as tf.io.decode_jpeg's: "" (TF's default, INTEGER_FAST), INTEGER_FAST, INTEGER_ACCURATE."""

    def __post_init__(self) -> None:
        try:
            size = _checked_size(self.size, "ImageDecoding.size")
        except ValueError as error:
            raise ConfigError(str(error), field="size", value=self.size) from None
        object.__setattr__(self, "size", size)
        _choice(self.channels, (1, 3, 4), "channels")
        _choice(self.method, RESIZE_METHODS, "method")
        _choice(self.layout, LAYOUTS, "layout")
        _choice(self.dct_method, DCT_METHODS, "dct_method")
        if self.scale is not None:
            if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)):
                raise ConfigTypeError(
                    f"ImageDecoding.scale must be a number or None; received {type(self.scale).__name__}.",
                    field="scale",
                    value=self.scale,
                )
            if not np.isfinite(self.scale):
                raise ConfigError(
                    f"ImageDecoding.scale must be finite; received {self.scale!r}.", field="scale", value=self.scale
                )
            object.__setattr__(self, "scale", float(self.scale))

    @property
    def shape(self) -> tuple[int, int, int]:
        """The shape of one decoded image."""
        height, width = self.size
        return (height, width, self.channels) if self.layout == "HWC" else (self.channels, height, width)

    def decode(self, contents: bytes, where: str | None = None) -> np.ndarray:
        """One image's bytes (PNG, JPEG, GIF: its first frame, BMP) to float32 of `shape`."""
        if sniff_format(_as_bytes(contents, where)) == "jpeg":
            pixels = _jpeg(bytes(contents), self.channels, self.dct_method, where)
        else:
            pixels = decode_image(contents, channels=self.channels, expand_animations=False, where=where)
        resized = resize_image(pixels, self.size, method=self.method)
        if self.scale is not None:
            resized *= np.float32(self.scale)
        return np.ascontiguousarray(resized.transpose(2, 0, 1)) if self.layout == "CHW" else resized

    def decode_batch(self, contents: Sequence[bytes], where: str | None = None) -> np.ndarray:
        """Several images' bytes to float32 [N, *shape]; an error names the item (`where [i]`)."""
        out = np.empty((len(contents), *self.shape), dtype=np.float32)
        for index, item in enumerate(contents):
            out[index] = self.decode(item, f"{_where(where)} [{index}]")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "size": list(self.size),
            "channels": self.channels,
            "method": self.method,
            "layout": self.layout,
            "scale": self.scale,
            "dct_method": self.dct_method,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "image decoding") -> ImageDecoding:
        """The ImageDecoding `to_json` wrote; anything else is a ConfigError naming `where` and the field."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{where}: expected an object with {sorted(_JSON_FIELDS)}; received {type(data).__name__}.", value=data
            )
        unknown = sorted(set(data) - set(_JSON_FIELDS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {unknown}; an image decoding has {sorted(_JSON_FIELDS)} "
                f"(written by a newer torchestimator?).",
                field=str(unknown[0]),
            )
        if "size" not in data:
            raise ConfigError(f"{where}: the key 'size' is missing.", field="size")
        values = dict(data)
        if isinstance(values["size"], list):
            values["size"] = tuple(values["size"])
        try:
            return cls(**values)
        except ConfigError as error:
            raise type(error)(f"{where}: {error}", field=error.field, value=error.value) from None


_JSON_FIELDS = tuple(field.name for field in dataclasses.fields(ImageDecoding))


def _choice(value: Any, allowed: Sequence[Any], name: str) -> None:
    if isinstance(value, bool) or value not in allowed or type(value) is not type(allowed[0]):
        raise ConfigError(
            f"ImageDecoding.{name} must be one of {list(allowed)}; received {value!r}.", field=name, value=value
        )
