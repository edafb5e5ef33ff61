"""Weights container, initialisation and the published state-dict layout."""

import numpy as np
import pytest
import pywt

from wtconv_cuda import WTConvWeights, init_weights, weights_from_state_dict, weights_to_state_dict
from wtconv_cuda import _arrays

from .conftest import random_weights

C, K = 3, 5


def published_haar_filters(channels):
    """``wt_filter`` and ``iwt_filter`` as the published layer builds them, in float32."""

    def bank(lo, hi):
        lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
        # torch: stack([lo.unsqueeze(0) * lo.unsqueeze(1), lo.unsqueeze(0) * hi.unsqueeze(1), ...])
        four = np.stack(
            [
                lo[None] * lo[:, None],
                lo[None] * hi[:, None],
                hi[None] * lo[:, None],
                hi[None] * hi[:, None],
            ]
        )
        return np.tile(four[:, None], (channels, 1, 1, 1))

    wavelet = pywt.Wavelet("db1")
    wt = bank(wavelet.dec_lo[::-1], wavelet.dec_hi[::-1])
    iwt = bank(wavelet.rec_lo[::-1][::-1], wavelet.rec_hi[::-1][::-1])
    return wt, iwt


def published_state_dict(rng, prefix="layer.", levels=2, bias=True):
    """A state dict in the published layout, built without the package."""
    wt, iwt = published_haar_filters(C)
    sd = {
        f"{prefix}base_conv.weight": rng.standard_normal((C, 1, K, K)).astype(np.float32),
        f"{prefix}base_scale.weight": rng.standard_normal((1, C, 1, 1)).astype(np.float32),
        f"{prefix}wt_filter": wt,
        f"{prefix}iwt_filter": iwt,
    }
    if bias:
        sd[f"{prefix}base_conv.bias"] = rng.standard_normal(C).astype(np.float32)
    for i in range(levels):
        sd[f"{prefix}wavelet_convs.{i}.weight"] = rng.standard_normal((4 * C, 1, K, K)).astype(
            np.float32
        )
        sd[f"{prefix}wavelet_scale.{i}.weight"] = rng.standard_normal((1, 4 * C, 1, 1)).astype(
            np.float32
        )
    return sd


# ---------------------------------------------------------------------------
# Container and initialisation
# ---------------------------------------------------------------------------


def test_properties_and_immutability():
    w = init_weights(6, 3, 4, seed=0)
    assert (w.channels, w.kernel_size, w.levels) == (6, 3, 4)
    with pytest.raises(AttributeError):
        w.base_weight = None


def test_init_shapes_dtype_and_constants():
    w = init_weights(7, 5, 3, dtype=np.float64, seed=1)
    assert w.base_weight.shape == (7, 5, 5) and w.base_bias.shape == (7,)
    assert w.wavelet_weight.shape == (3, 7, 4, 5, 5) and w.wavelet_scale.shape == (3, 7, 4)
    assert all(a.dtype == np.float64 for a in w)
    np.testing.assert_array_equal(w.base_scale, np.ones(7))
    np.testing.assert_array_equal(w.wavelet_scale, np.full((3, 7, 4), 0.1))
    assert init_weights(4).base_weight.dtype == np.float32
    assert init_weights(4, bias=False).base_bias is None


def test_init_statistics_follow_pytorch_conv_default():
    k = 5
    w = init_weights(256, k, 2, seed=2)
    bound = 1.0 / k  # 1 / sqrt(fan_in) with fan_in = K * K
    for a in (w.base_weight, w.base_bias, w.wavelet_weight):
        assert np.abs(a).max() <= bound
        assert np.abs(a).max() > 0.95 * bound
        assert abs(a.mean()) < 0.05 * bound
        np.testing.assert_allclose(a.std(), bound / np.sqrt(3), rtol=0.1)  # uniform(-b, b)


def test_init_seed_reproducible_and_distinct():
    a, b, c = (
        init_weights(4, 3, 2, seed=5),
        init_weights(4, 3, 2, seed=5),
        init_weights(4, 3, 2, seed=6),
    )
    np.testing.assert_array_equal(a.wavelet_weight, b.wavelet_weight)
    assert not np.array_equal(a.wavelet_weight, c.wavelet_weight)


def test_init_zero_levels():
    w = init_weights(4, 3, 0)
    assert w.wavelet_weight.shape == (0, 4, 4, 3, 3) and w.wavelet_scale.shape == (0, 4, 4)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(channels=0), ValueError, "channels must be >= 1, got 0"),
        (dict(channels=2.0), TypeError, "channels must be an int, got float"),
        (dict(channels=2, kernel_size=4), ValueError, "kernel_size must be odd, got 4"),
        (dict(channels=2, kernel_size=0), ValueError, "kernel_size must be >= 1, got 0"),
        (dict(channels=2, levels=-1), ValueError, "levels must be >= 0, got -1"),
        (
            dict(channels=2, dtype=np.int32),
            TypeError,
            "dtype must be float16, float32 or float64, got int32",
        ),
    ],
)
def test_init_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        init_weights(**kwargs)


# ---------------------------------------------------------------------------
# State dict
# ---------------------------------------------------------------------------


def test_published_state_dict_layout_is_read_correctly(rng):
    sd = published_state_dict(rng)
    w = weights_from_state_dict(sd, prefix="layer")
    assert (w.channels, w.kernel_size, w.levels) == (C, K, 2)
    c, k, i = 2, 3, 1  # row 4*c + k of level i + 1
    np.testing.assert_array_equal(
        w.wavelet_weight[i, c, k], sd[f"layer.wavelet_convs.{i}.weight"][4 * c + k, 0]
    )
    assert w.wavelet_scale[i, c, k] == sd[f"layer.wavelet_scale.{i}.weight"][0, 4 * c + k, 0, 0]
    np.testing.assert_array_equal(w.base_weight[c], sd["layer.base_conv.weight"][c, 0])
    np.testing.assert_array_equal(w.base_scale, sd["layer.base_scale.weight"].ravel())
    np.testing.assert_array_equal(w.base_bias, sd["layer.base_conv.bias"])


def test_published_filters_are_float32_rounded_half():
    wt, _ = published_haar_filters(C)
    assert wt.dtype == np.float32 and not np.all(np.abs(wt) == 0.5)
    assert np.abs(np.abs(wt) - 0.5).max() < 1e-7


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("levels", [0, 1, 3])
def test_round_trip_is_unchanged(rng, levels, bias):
    w = random_weights(rng, C, K, levels, bias=bias, dtype=np.float32)
    sd = weights_to_state_dict(w, prefix="net.block")
    back = weights_from_state_dict(sd, prefix="net.block.")
    for a, b in zip(w, back):
        if a is None:
            assert b is None
        else:
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_export_writes_published_names_shapes_and_filters(rng):
    w = random_weights(rng, C, K, 2, dtype=np.float32)
    sd = weights_to_state_dict(w, prefix="p")
    expected = {
        "p.base_conv.weight": (C, 1, K, K),
        "p.base_conv.bias": (C,),
        "p.base_scale.weight": (1, C, 1, 1),
        "p.wavelet_convs.0.weight": (4 * C, 1, K, K),
        "p.wavelet_convs.1.weight": (4 * C, 1, K, K),
        "p.wavelet_scale.0.weight": (1, 4 * C, 1, 1),
        "p.wavelet_scale.1.weight": (1, 4 * C, 1, 1),
        "p.wt_filter": (4 * C, 1, 2, 2),
        "p.iwt_filter": (4 * C, 1, 2, 2),
    }
    assert {key: a.shape for key, a in sd.items()} == expected
    wt, iwt = published_haar_filters(C)
    for key, published in (("p.wt_filter", wt), ("p.iwt_filter", iwt)):
        assert sd[key].dtype == np.float32
        np.testing.assert_array_equal(np.abs(sd[key]), 0.5)
        np.testing.assert_allclose(sd[key], published, atol=1e-7)
    assert sd["p.wavelet_scale.1.weight"][0, 4 * 2 + 3, 0, 0] == w.wavelet_scale[1, 2, 3]


def test_other_layers_are_ignored(rng):
    sd = published_state_dict(rng, prefix="a.")
    sd.update(published_state_dict(rng, prefix="a0.", levels=1))
    assert weights_from_state_dict(sd, "a").levels == 2
    assert weights_from_state_dict(sd, "a0").levels == 1


def test_stride_filter_is_accepted(rng):
    sd = published_state_dict(rng, prefix="")
    sd["stride_filter"] = np.ones((C, 1, 1, 1), np.float32)
    assert weights_from_state_dict(sd).levels == 2
    sd["stride_filter"] = np.full((C, 1, 1, 1), 2.0, np.float32)
    with pytest.raises(ValueError, match="stride_filter is not the Haar"):
        weights_from_state_dict(sd)


def _swap_lh_hl(f):
    f = f.copy().reshape(C, 4, 1, 2, 2)
    f[:, [1, 2]] = f[:, [2, 1]]
    return f.reshape(4 * C, 1, 2, 2)


@pytest.mark.parametrize("name", ["wt_filter", "iwt_filter"])
@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(_swap_lh_hl, id="LH-HL-swapped"),
        pytest.param(lambda f: -f, id="negated"),
        pytest.param(lambda f: f * np.float32(0.9999), id="off-by-1e-4"),
        pytest.param(
            lambda f: np.tile(f[:4], (C, 1, 1, 1))
            * np.where(np.arange(4 * C) == 5, -1, 1)[:, None, None, None],
            id="one-row-flipped",
        ),
    ],
)
def test_wrong_haar_filters_are_rejected(rng, name, corrupt):
    sd = published_state_dict(rng, prefix="")
    sd[name] = corrupt(sd[name]).astype(np.float32)
    with pytest.raises(ValueError, match=f"{name} is not the Haar \\(db1\\) filter bank"):
        weights_from_state_dict(sd)


def test_wrong_filter_shape_is_rejected(rng):
    sd = published_state_dict(rng, prefix="")
    sd["wt_filter"] = sd["wt_filter"][:4]
    with pytest.raises(
        ValueError, match=r"wt_filter must have shape \(12, 1, 2, 2\), got \(4, 1, 2, 2\)"
    ):
        weights_from_state_dict(sd)


def test_missing_entry_is_a_key_error(rng):
    sd = published_state_dict(rng, prefix="m.")
    del sd["m.wavelet_scale.1.weight"]
    with pytest.raises(KeyError, match="state dict has no entry 'm.wavelet_scale.1.weight'"):
        weights_from_state_dict(sd, "m")
    with pytest.raises(KeyError, match="'other.base_conv.weight'"):
        weights_from_state_dict(sd, "other")


def test_export_rejects_non_weights():
    with pytest.raises(TypeError, match="WTConvWeights"):
        weights_to_state_dict({"base_weight": np.zeros((1, 3, 3))})


def test_gap_in_levels_is_rejected(rng):
    sd = published_state_dict(rng, prefix="", levels=3)
    del sd["wavelet_convs.1.weight"], sd["wavelet_scale.1.weight"]
    with pytest.raises(
        ValueError, match=r"unexpected state dict entries .*wavelet_convs\.2\.weight"
    ):
        weights_from_state_dict(sd)


@pytest.mark.parametrize(
    "key, shape, match",
    [
        ("base_conv.weight", (C, 1, K, K - 2), r"base_conv.weight must have shape \(C, 1, K, K\)"),
        ("base_conv.bias", (C + 1,), r"base_conv.bias must have shape \(3,\), got \(4,\)"),
        ("base_scale.weight", (C,), r"base_scale.weight must have shape \(1, 3, 1, 1\)"),
        (
            "wavelet_convs.0.weight",
            (4 * C, 1, 3, 3),
            r"wavelet_convs.0.weight must have shape \(12, 1, 5, 5\)",
        ),
        (
            "wavelet_scale.1.weight",
            (1, C, 1, 1),
            r"wavelet_scale.1.weight must have shape \(1, 12, 1, 1\)",
        ),
    ],
)
def test_wrong_entry_shape_is_rejected(rng, key, shape, match):
    sd = published_state_dict(rng, prefix="")
    sd[key] = rng.standard_normal(shape).astype(np.float32)
    with pytest.raises(ValueError, match=match):
        weights_from_state_dict(sd)


def test_torch_round_trip():
    torch = pytest.importorskip("torch")
    w = init_weights(C, K, 2, seed=0)
    tw = WTConvWeights(*(torch.from_numpy(a) for a in w))
    sd = weights_to_state_dict(tw, "t")
    assert all(isinstance(a, torch.Tensor) for a in sd.values())
    back = weights_from_state_dict(sd, "t")
    assert isinstance(back.wavelet_weight, torch.Tensor)
    for a, b in zip(w, back):
        np.testing.assert_array_equal(a, b.numpy())


# ---------------------------------------------------------------------------
# Array-library detection (no library is imported for it)
# ---------------------------------------------------------------------------


def _fake(module, name="Array"):
    return type(name, (), {"__module__": module})()


@pytest.mark.parametrize(
    "obj, library",
    [
        (np.zeros(2), "numpy"),
        (np.float32(1.0), "numpy"),
        ([1.0], None),
        (1.0, None),
        (_fake("cupy._core.core", "ndarray"), "cupy"),
        (_fake("torch", "Tensor"), "torch"),
        (_fake("jaxlib.xla_extension", "ArrayImpl"), "jax"),
        (_fake("jax._src.array", "ArrayImpl"), "jax"),
        (_fake("numpyish"), None),
    ],
)
def test_array_library(obj, library):
    assert _arrays.array_library(obj) == library
