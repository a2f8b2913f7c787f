"""tf.image.resize (antialias=False) in numpy float32: bilinear, nearest, bicubic and area.

What belongs here: the four resize kernels, written as TensorFlow 2.21's CPU
kernels compute them (the same float32 operations in the same order), so that
bilinear, nearest and bicubic give TF's values bit for bit and area within
float32 rounding of the sum order. What does not: decoding, checking the
caller's arguments (`images.resize_image` does both).

- bilinear: ResizeBilinear with half_pixel_centers=True: source coordinate
  (x + 0.5) * scale - 0.5, scale = float32(in / out), lower = max(floor, 0),
  upper = min(ceil, in - 1), weight = coordinate - floor; top, bottom, then
  the vertical lerp, each as `a + (b - a) * w`. This is torch's
  interpolate(mode="bilinear", align_corners=False, antialias=False) up to
  float32 rounding (torch forms w0 * a + w1 * b).
- nearest: ResizeNearestNeighbor with half_pixel_centers=True: source index
  min(floor((x + 0.5) * scale), in - 1) (torch's "nearest-exact", not
  "nearest", which drops the half pixel).
- bicubic: ResizeBicubic with half_pixel_centers=True: Keys' cubic with
  a = -0.5 from TF's 1024-entry table, taps outside the image weighted 0 and
  the rest renormalised (torch's bicubic uses a = -0.75 and repeats the edge);
  rows first, then columns.
- area: ResizeArea: each output pixel the mean of the input box it covers,
  partial pixels weighted by their covered fraction.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32
_TABLE_SIZE = 1024


def _scale(in_size: int, out_size: int) -> np.float32:
    return _F32(in_size) / _F32(out_size)


def _bilinear_axis(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    coordinate = (np.arange(out_size, dtype=_F32) + _F32(0.5)) * _scale(in_size, out_size) - _F32(0.5)
    floor = np.floor(coordinate)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(coordinate).astype(np.int64), in_size - 1)
    return lower, upper, (coordinate - floor).astype(_F32)


def bilinear(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """NHWC float32 in, NHWC float32 out."""
    y_low, y_high, y_lerp = _bilinear_axis(images.shape[1], height)
    x_low, x_high, x_lerp = _bilinear_axis(images.shape[2], width)
    x_lerp = x_lerp[None, None, :, None]
    top, bottom = images[:, y_low], images[:, y_high]
    top = top[:, :, x_low] + (top[:, :, x_high] - top[:, :, x_low]) * x_lerp
    bottom = bottom[:, :, x_low] + (bottom[:, :, x_high] - bottom[:, :, x_low]) * x_lerp
    return top + (bottom - top) * y_lerp[None, :, None, None]


def _nearest_axis(in_size: int, out_size: int) -> np.ndarray:
    coordinate = (np.arange(out_size, dtype=_F32) + _F32(0.5)) * _scale(in_size, out_size)
    return np.clip(np.floor(coordinate).astype(np.int64), 0, in_size - 1)


def nearest(images: np.ndarray, height: int, width: int) -> np.ndarray:
    rows = _nearest_axis(images.shape[1], height)
    columns = _nearest_axis(images.shape[2], width)
    return images[:, rows][:, :, columns]


def _keys_table() -> np.ndarray:
    # TF's GetCoeffsTable(use_keys_cubic=True): float A = -0.5, x = i / 1024 computed in double, then float math.
    a = _F32(-0.5)
    table = np.empty((_TABLE_SIZE + 1, 2), dtype=_F32)
    x = (np.arange(_TABLE_SIZE + 1, dtype=np.float64) * 1.0 / _TABLE_SIZE).astype(_F32)
    table[:, 0] = ((a + _F32(2)) * x - (a + _F32(3))) * x * x + _F32(1)
    x = x + _F32(1.0)
    table[:, 1] = ((a * x - _F32(5) * a) * x + _F32(8) * a) * x - _F32(4) * a
    return table


def _bicubic_axis(in_size: int, out_size: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    table = _keys_table()
    coordinate = (np.arange(out_size, dtype=_F32) + _F32(0.5)) * _scale(in_size, out_size) - _F32(0.5)
    base = np.floor(coordinate).astype(np.int64)
    delta = coordinate - np.floor(coordinate)
    offset = np.rint(delta * _F32(_TABLE_SIZE)).astype(np.int64)  # lrintf: round half to even, as np.rint
    raw = [table[offset, 1], table[offset, 0], table[_TABLE_SIZE - offset, 0], table[_TABLE_SIZE - offset, 1]]
    indices, weights = [], []
    for tap in range(4):
        wanted = base - 1 + tap
        index = np.clip(wanted, 0, in_size - 1)
        indices.append(index)
        weights.append(np.where(index == wanted, raw[tap], _F32(0)).astype(_F32))
    total = ((weights[0] + weights[1]) + weights[2]) + weights[3]
    usable = np.abs(total) >= _F32(1000) * np.finfo(_F32).tiny
    inverse = np.where(usable, _F32(1) / np.where(usable, total, _F32(1)), _F32(1)).astype(_F32)
    return indices, [np.where(usable, weight * inverse, weight).astype(_F32) for weight in weights]


def _cubic_sum(values: list[np.ndarray], weights: list[np.ndarray]) -> np.ndarray:
    # Interpolate1D: v0 * w0 + v1 * w1 + v2 * w2 + v3 * w3, left to right.
    return ((values[0] * weights[0] + values[1] * weights[1]) + values[2] * weights[2]) + values[3] * weights[3]


def bicubic(images: np.ndarray, height: int, width: int) -> np.ndarray:
    y_index, y_weight = _bicubic_axis(images.shape[1], height)
    x_index, x_weight = _bicubic_axis(images.shape[2], width)
    x_weight = [weight[None, None, :, None] for weight in x_weight]
    rows = [images[:, index] for index in y_index]  # four [N, out_h, W, C]
    along_x = [_cubic_sum([row[:, :, index] for index in x_index], x_weight) for row in rows]
    return _cubic_sum(along_x, [weight[None, :, None, None] for weight in y_weight])


def _area_weights(in_size: int, out_size: int) -> np.ndarray:
    """[out, in] float32: the covered fraction of each input pixel in each output pixel's box."""
    scale = _scale(in_size, out_size)
    weights = np.zeros((out_size, in_size), dtype=_F32)
    for out in range(out_size):
        start, end = _F32(out) * scale, _F32(out + 1) * scale
        for index in range(int(np.floor(start)), int(np.ceil(end))):
            if index < start:
                weight = scale if index + 1 > end else _F32(index + 1) - start
            else:
                weight = end - _F32(index) if index + 1 > end else _F32(1.0)
            weights[out, min(index, in_size - 1)] += weight
    return weights


def area(images: np.ndarray, height: int, width: int) -> np.ndarray:
    in_height, in_width = images.shape[1:3]
    rows = _area_weights(in_height, height)
    columns = _area_weights(in_width, width)
    norm = _F32(1.0) / (_scale(in_height, height) * _scale(in_width, width))
    batch, _, _, channels = images.shape
    summed = np.matmul(rows, images.reshape(batch, in_height, in_width * channels))  # [N, h, W * C]
    summed = summed.reshape(batch, height, in_width, channels).transpose(0, 1, 3, 2) @ columns.T  # [N, h, C, w]
    return np.ascontiguousarray((summed * norm).astype(_F32).transpose(0, 1, 3, 2))


KERNELS = {"bilinear": bilinear, "nearest": nearest, "bicubic": bicubic, "area": area}
