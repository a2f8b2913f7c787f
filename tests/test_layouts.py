"""Layout converters: a Keras-layout op computed with numpy equals the torch op after conversion."""

from __future__ import annotations

import numpy
import pytest
import torch
import torch.nn.functional as F

from torchestimator.interop import layouts

RNG = numpy.random.default_rng(0)


def random(*shape: int) -> numpy.ndarray:
    return RNG.standard_normal(shape).astype(numpy.float64)


def conv_nhwc_reference(inputs: numpy.ndarray, kernel: numpy.ndarray) -> numpy.ndarray:
    """VALID, stride-1 cross-correlation with an HWIO kernel, as tf.nn.conv2d computes it."""
    kh, kw, _, _ = kernel.shape
    batch, height, width, _ = inputs.shape
    out = numpy.zeros((batch, height - kh + 1, width - kw + 1, kernel.shape[3]))
    for a in range(kh):
        for b in range(kw):
            out += numpy.einsum("nhwi,io->nhwo", inputs[:, a : a + out.shape[1], b : b + out.shape[2], :], kernel[a, b])
    return out


def test_dense_to_linear_matches_keras_matmul() -> None:
    kernel, bias, x = random(5, 3), random(3), random(4, 5)
    keras = x @ kernel + bias
    weight = layouts.dense_to_linear(kernel)
    assert weight.shape == (3, 5) and weight.flags.c_contiguous
    out = F.linear(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias)).numpy()
    numpy.testing.assert_allclose(out, keras, rtol=1e-12)


def test_conv2d_hwio_to_oihw_matches_reference() -> None:
    kernel, x = random(3, 2, 4, 6), random(2, 7, 6, 4)
    reference = conv_nhwc_reference(x, kernel)
    weight = layouts.conv_to_torch(kernel)
    assert weight.shape == (6, 4, 3, 2)
    out = F.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(weight)).permute(0, 2, 3, 1).numpy()
    numpy.testing.assert_allclose(out, reference, rtol=1e-10, atol=1e-12)


def test_conv1d_and_conv3d_match_reference() -> None:
    kernel1, x1 = random(3, 2, 5), random(2, 8, 2)
    reference1 = conv_nhwc_reference(x1[:, None], kernel1[None])[:, 0]
    out1 = F.conv1d(torch.from_numpy(x1).permute(0, 2, 1), torch.from_numpy(layouts.conv_to_torch(kernel1)))
    numpy.testing.assert_allclose(out1.permute(0, 2, 1).numpy(), reference1, rtol=1e-10, atol=1e-12)

    kernel3, x3 = random(1, 2, 3, 2, 4), random(1, 3, 4, 5, 2)
    # A depth-1 kernel over depth d is d independent 2D convolutions.
    reference3 = numpy.stack([conv_nhwc_reference(x3[:, d], kernel3[0]) for d in range(3)], axis=1)
    weight3 = layouts.conv_to_torch(kernel3)
    assert weight3.shape == (4, 2, 1, 2, 3)
    out3 = F.conv3d(torch.from_numpy(x3).permute(0, 4, 1, 2, 3), torch.from_numpy(weight3)).permute(0, 2, 3, 4, 1)
    numpy.testing.assert_allclose(out3.numpy(), reference3, rtol=1e-10, atol=1e-12)


def test_depthwise_conv_matches_per_channel_reference() -> None:
    channels, multiplier = 3, 2
    kernel, x = random(2, 3, channels, multiplier), random(2, 5, 6, channels)
    # TF output channel c*multiplier + m is input channel c convolved with kernel[..., c, m].
    reference = numpy.concatenate(
        [conv_nhwc_reference(x[..., c : c + 1], kernel[:, :, c : c + 1, :]) for c in range(channels)], axis=-1
    )
    weight = layouts.depthwise_conv_to_torch(kernel)
    assert weight.shape == (channels * multiplier, 1, 2, 3)
    out = F.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(weight), groups=channels)
    numpy.testing.assert_allclose(out.permute(0, 2, 3, 1).numpy(), reference, rtol=1e-10, atol=1e-12)


def test_conv_transpose_matches_scatter_reference() -> None:
    stride = 2
    kernel, x = random(3, 2, 5, 4), random(1, 3, 4, 4)  # TF kernel [h, w, out, in]
    kh, kw, out_channels, _ = kernel.shape
    reference = numpy.zeros((1, (3 - 1) * stride + kh, (4 - 1) * stride + kw, out_channels))
    for i in range(3):
        for j in range(4):
            contribution = numpy.einsum("ni,abOi->nabO", x[:, i, j], kernel)
            reference[:, i * stride : i * stride + kh, j * stride : j * stride + kw] += contribution
    weight = layouts.conv_transpose_to_torch(kernel)
    assert weight.shape == (4, 5, 3, 2)
    out = F.conv_transpose2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(weight), stride=stride)
    numpy.testing.assert_allclose(out.permute(0, 2, 3, 1).numpy(), reference, rtol=1e-10, atol=1e-12)


def test_flatten_nhwc_to_nchw_makes_dense_after_conv_agree() -> None:
    channels, height, width, units = 3, 4, 5, 7
    features_nhwc = random(2, height, width, channels)
    kernel = random(height * width * channels, units)
    keras = features_nhwc.reshape(2, -1) @ kernel
    features_nchw = torch.from_numpy(features_nhwc).permute(0, 3, 1, 2).flatten(1)
    # Without the reorder, the plain transpose gives different outputs: the helper is needed.
    wrong = F.linear(features_nchw, torch.from_numpy(layouts.dense_to_linear(kernel))).numpy()
    assert not numpy.allclose(wrong, keras)
    fixed = layouts.flatten_nhwc_to_nchw(kernel, channels, height, width)
    out = F.linear(features_nchw, torch.from_numpy(layouts.dense_to_linear(fixed))).numpy()
    numpy.testing.assert_allclose(out, keras, rtol=1e-10)
    converter = layouts.flatten_dense_converter(channels, height, width)
    numpy.testing.assert_array_equal(converter(kernel), layouts.dense_to_linear(fixed))
    assert converter.output_shape(kernel.shape) == (units, height * width * channels)
    assert converter.output_shape((10, units)) is None


def test_flatten_rejects_wrong_feature_shape() -> None:
    with pytest.raises(ValueError, match=r"60 rows, but channels\*height\*width = 3\*4\*4 = 48"):
        layouts.flatten_nhwc_to_nchw(random(60, 2), 3, 4, 4)
    with pytest.raises(ValueError, match="channels must be a positive int"):
        layouts.flatten_nhwc_to_nchw(random(60, 2), 0, 4, 4)


def test_embedding_is_identity_and_checks_rank() -> None:
    table = random(10, 4)
    numpy.testing.assert_array_equal(layouts.embedding(table), table)
    with pytest.raises(ValueError, match=r"embedding table \[vocabulary, dim\].*received shape \(10,\)"):
        layouts.embedding(random(10))


def test_converters_refuse_wrong_rank_and_type() -> None:
    with pytest.raises(ValueError, match=r"dense_to_linear expects a Dense kernel.*\(2, 3, 4\)"):
        layouts.dense_to_linear(random(2, 3, 4))
    with pytest.raises(ValueError, match="conv_to_torch"):
        layouts.conv_to_torch(random(3, 3))
    with pytest.raises(TypeError, match="numpy array; received list"):
        layouts.dense_to_linear([[1.0]])


def test_registry_shapes_agree_with_functions() -> None:
    samples = {
        "identity": random(4),
        "dense_to_linear": random(5, 3),
        "conv_to_torch": random(3, 3, 2, 8),
        "depthwise_conv_to_torch": random(3, 3, 4, 2),
        "conv_transpose_to_torch": random(2, 2, 3, 5),
        "embedding": random(9, 2),
    }
    assert set(samples) == set(layouts.CONVERTERS)
    for name, array in samples.items():
        converter = layouts.get_converter(name)
        assert converter.name == name and converter.description
        assert layouts.converted_shape(name, array.shape) == converter(array).shape
    assert layouts.converted_shape("dense_to_linear", (3, 3, 2)) is None
    with pytest.raises(ValueError, match="Unknown layout converter 'transpose'; known converters: conv_to"):
        layouts.get_converter("transpose")


def test_batchnorm_names_and_inference_equivalence() -> None:
    names = layouts.batchnorm_names("block/batch_normalization", "block.bn")
    assert names == {
        "block.bn.weight": "block/batch_normalization/gamma",
        "block.bn.bias": "block/batch_normalization/beta",
        "block.bn.running_mean": "block/batch_normalization/moving_mean",
        "block.bn.running_var": "block/batch_normalization/moving_variance",
    }
    gamma, beta, mean = random(3), random(3), random(3)
    variance = numpy.abs(random(3)) + 0.1
    x = random(4, 3)
    keras = gamma * (x - mean) / numpy.sqrt(variance + 1e-3) + beta
    module = torch.nn.BatchNorm1d(3, eps=1e-3, momentum=0.01).double().eval()
    source = {"gamma": gamma, "beta": beta, "moving_mean": mean, "moving_variance": variance}
    module.load_state_dict(
        {layouts.BATCHNORM_NAMES[key]: torch.from_numpy(value) for key, value in source.items()}, strict=False
    )
    numpy.testing.assert_allclose(module(torch.from_numpy(x)).detach().numpy(), keras, rtol=1e-10)
    assert layouts.check_batchnorm_conventions(1e-3, 0.99, module) == []


def test_check_batchnorm_conventions_warns_on_torch_defaults() -> None:
    warnings = layouts.check_batchnorm_conventions(1e-3, 0.99, torch.nn.BatchNorm2d(4))
    assert len(warnings) == 2
    assert "epsilon=0.001" in warnings[0] and "eps=1e-05" in warnings[0]
    assert "torch momentum=0.01" in warnings[1] and "momentum=0.1" in warnings[1]
    cumulative = layouts.check_batchnorm_conventions(None, 0.9, torch.nn.BatchNorm1d(2, momentum=None))
    assert len(cumulative) == 1 and "momentum=None" in cumulative[0]
    assert layouts.check_batchnorm_conventions(1e-5, None, torch.nn.BatchNorm1d(2)) == []
    with pytest.raises(TypeError, match="must be a torch.nn.BatchNorm"):
        layouts.check_batchnorm_conventions(1e-3, 0.99, torch.nn.Linear(2, 2))
