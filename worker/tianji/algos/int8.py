"""The actor's Nature CNN in int8 (spec.model.actorPrecision: int8), through oneDNN's u8s8
convolution and product kernels (the ones torch's x86 int8 lowering emits: `onednn::qconv2d_pointwise`,
`qlinear_pointwise`), called directly on plain uint8 / int8 tensors.

Weights are quantized per output channel (symmetric int8) and packed once per policy version.
Activations are uint8 per tensor over the [0, max] a ReLU leaves, at scales that follow the data
call by call: each convolution writes uint8 at HEADROOM over its previous call's largest output,
and a call that reaches 255 (it may have clipped) runs again in float32 and is scaled to its own
range, as is every layer's first call. So no output is ever clipped and a scale is never stale
(static scales calibrated on one batch were 14 % of the Q-values' range off on later frames of the
same episode); about 3 % of the convolutions run twice on Pong. A CNN that takes pixels reads them
as they are, uint8 with scale 1/255; one behind the per-pixel observation normaliser (PPO's
normalizeObservations) takes the raw pixels and normalises them in its input quantization
(`Standardized`). The 3136x512 layer returns float32 features for the float32 heads; at an
actor's 8 rows it is bound by reading its weights, and int8 reads a quarter of float32's bytes.

`Int8NatureCNN.build` returns None, and the caller acts in float32, on a CPU without VNNI (`vnni`)
and where its first rows disagree with float32 by more than MAX_ERROR of the features' range. A build
(quantizing and packing 1.7 M weights) costs milliseconds, so `Int8Policy` (models.py) spaces
builds out.
"""
from __future__ import annotations

import functools
import logging
from typing import Optional

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)

HEADROOM = 1.25  # a convolution's next uint8 output range over the largest output of its last call
# |int8 - float32| features relative to their largest, on the build's first rows, that refuses a
# build: a guard against kernels that compute something else, not a quality bar. With VNNI a DQN's
# Pong features are 2.3-2.8 % off, PPO's behind fitted pixel statistics 3.4-5.0 % (sparse +-5
# pixels leave most of the first layer's uint8 levels unused); without, 16-bit sums 5-10 %,
# which `vnni` refuses.
MAX_ERROR = 0.1
CHECK_ROWS = 2  # the build's float32 check runs on this many rows
_LAYERS = (nn.Conv2d, nn.ReLU, nn.Conv2d, nn.ReLU, nn.Conv2d, nn.ReLU, nn.Flatten, nn.Linear, nn.ReLU)
_OPS = ("qconv_prepack", "qconv2d_pointwise", "qlinear_prepack", "qlinear_pointwise")


def ops():
    """torch.ops.onednn where its int8 kernels are here, else None."""
    found = getattr(torch.ops, "onednn", None)
    if not torch.backends.mkldnn.is_available() or found is None or not all(hasattr(found, n) for n in _OPS):
        return None
    return found


@functools.cache
def vnni() -> bool:
    """Whether this CPU sums u8s8 products into 32 bits in one instruction (AVX512-VNNI, AVX-VNNI,
    AMX). Without, oneDNN's 16-bit intermediate sums saturate: held to AVX512_CORE, the Q-values
    were 8.6 % of their range off float32's on Pong frames, against 3.0 % with VNNI."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def _per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel and the scales (one pass for the range, one to scale, round
    and cast: torch.quantize_per_channel took 7 ms for the 3136x512 layer, this 2)."""
    flat = w.detach().flatten(1)
    scale = (torch.maximum(flat.amax(1), -flat.amin(1)) / 127.0).clamp_min(1e-12)
    q = torch.mul(w.detach(), (1.0 / scale).view(-1, *[1] * (w.dim() - 1))).round_().to(torch.int8)
    return q, scale


_HALF = torch.tensor(0.5)


def _to_uint8(y: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A ReLU's output (>= 0, channels-last as the kernels return it) as uint8 over [0, max], and
    its scale. amax, not max: max copies a channels-last tensor first (9 against 73 µs here)."""
    scale = max(float(y.amax()), 1e-12) / 255.0
    return torch.add(_HALF, y, alpha=1.0 / scale).to(torch.uint8), scale  # + 0.5, truncated: rounded


def _planes_last(planes: np.ndarray) -> np.ndarray:
    """[B, C, H, W] as [B, H, W, C]: numpy's stack of the C planes interleaves them about 3x faster
    than torch's channels-last copy (100 against 300 µs for 8 Pong stacks here), and either beats
    the first kernel's own reorder."""
    return np.stack([planes[:, c] for c in range(planes.shape[1])], axis=-1)


def _channels_last(q: torch.Tensor) -> torch.Tensor:
    """uint8 [B, C, H, W] laid out channels-last, as the kernels read it."""
    return torch.from_numpy(_planes_last(q.numpy())).permute(0, 3, 1, 2)


def float32_features(net: nn.Sequential, x: torch.Tensor, pixels: bool, rms=None) -> torch.Tensor:
    """What `net` computes in float32 from the input its int8 kernels take (`Int8NatureCNN.build`):
    pixels scaled by 1/255, raw observations normalised by `rms`, or an already normalised input."""
    if rms is not None:
        return net(rms.normalize(x))
    return net(x.float() / 255.0 if pixels else x.float())


def _signed_to_uint8(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """A float tensor as uint8 over [min(0, lo), max(0, hi)], its scale and zero point."""
    lo, hi = torch.aminmax(x)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = max(hi - lo, 1e-12) / 255.0
    zero = int(round(-lo / scale))
    return torch.mul(x, 1.0 / scale).add_(zero + 0.5).clamp_(0.0, 255.0).to(torch.uint8), scale, zero


class Standardized:
    """An observation normaliser `rms` ((x - mean) / std per pixel, clipped to +-clip) and the first
    kernel's input quantization in one affine pass, x * a + b per pixel in channels-last order.
    Normalising in float32, then quantizing over the batch's range and laying the result out
    channels-last took 67 µs per Pong frame here, this 32 (the minimum's pass included). uint8
    covers [lo, clip]: pixels that appear on a still background reach +clip every frame, but the
    low side is narrower (-1.75 on Pong's frames), so `lo` follows the calls' smallest value at
    HEADROOM, only ever widening: a call below it runs again at the full +-clip and widens it.
    A snapshot of the statistics: build again after they change."""

    def __init__(self, rms):
        mean, std = (t.double() for t in rms._float32_stats())  # the normaliser's own float32 values
        self._mean, self._std, self.clip = mean, std, float(rms.clip)
        self._fit(-self.clip)
        self._lo: Optional[float] = None  # normalised units; None: the first call sets it

    def _fit(self, lo: float) -> None:
        """uint8 0..254 over [lo, clip]: an integer zero point, +clip at 254 exactly."""
        self.zero = min(int(np.ceil(254.0 * -lo / (self.clip - lo))), 127)
        self.scale = self.clip / (254 - self.zero)
        a = 1.0 / (self._std * self.scale)
        b = self.zero + 0.5 - self._mean * a  # + 0.5: the uint8 cast truncates
        self._a, self._b = (np.ascontiguousarray(np.moveaxis(t.float().numpy(), 0, -1)) for t in (a, b))

    def _affine(self, stacked: np.ndarray) -> np.ndarray:
        y = stacked.astype(np.float32)
        np.multiply(y, self._a, out=y)
        return np.add(y, self._b, out=y)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        """uint8 [B, C, H, W] laid out channels-last, its scale and zero point."""
        stacked = _planes_last(x.numpy())
        y = self._affine(stacked)
        low = float(y.min())
        if low < 0.5 and self.zero < 127:  # below lo: this call at the full range
            self._fit(-self.clip)
            y = self._affine(stacked)
            low = float(y.min())
        scale, zero = self.scale, self.zero
        q = torch.from_numpy(np.clip(y, 0.5, 254.5, out=y).astype(np.uint8)).permute(0, 3, 1, 2)
        lo = max(min((low - 0.5 - zero) * scale, 0.0) * HEADROOM, -self.clip)  # this call's smallest
        if self._lo is None or lo < self._lo:
            self._lo = lo
            self._fit(lo)
        return q, scale, zero


class Int8NatureCNN:
    """A snapshot of a float32 NatureCNN `net`'s weights (and of the normaliser `rms` in front of
    it, if any) as int8 kernels: build again after they change."""

    def __init__(self, onednn, net: nn.Sequential, pixels: bool, rms=None):
        self._ops, self._pixels = onednn, pixels
        self._standardized = Standardized(rms) if rms is not None else None
        first_scale = 1 / 255.0 if pixels else self._standardized.scale if rms is not None else 1.0
        self._convs = []
        for i, c in enumerate(m for m in net if isinstance(m, nn.Conv2d)):
            q, scale = _per_channel(c.weight)
            geometry = (list(c.stride), list(c.padding), list(c.dilation), c.groups)
            x_scale = first_scale if i == 0 else 1.0  # only a kernel's accuracy, not its result
            packed = onednn.qconv_prepack(q, scale, x_scale, 0, *geometry, None)
            self._convs.append((packed, scale, torch.zeros(len(scale), dtype=torch.long), c.bias.detach(), geometry))
        self._out_scales: list[Optional[float]] = [None] * len(self._convs)  # uint8 output scales (_conv)
        self.rescaled = 0  # convolutions run again in float32: a first call, or one that clipped
        fc = net[7]
        q, scale = _per_channel(fc.weight)
        self._fc = (onednn.qlinear_prepack(q, None), scale, torch.zeros(len(scale), dtype=torch.long), fc.bias.detach())

    @classmethod
    def build(cls, net: nn.Sequential, x: torch.Tensor, pixels: bool, rms=None) -> Optional[Int8NatureCNN]:
        """Kernels for `net` (uint8 pixels in where `pixels`; raw observations normalised by `rms`
        where given; else the normalised float input), checked on `x`'s first rows; None where they
        cannot run here or disagree (module docstring)."""
        onednn = ops()
        if onednn is None or tuple(type(m) for m in net) != _LAYERS or net[0].weight.dtype != torch.float32:
            return None
        if not vnni():
            log.warning("this CPU has no VNNI (int8 sums would saturate, vnni()); acting in float32")
            return None
        rows = x[:CHECK_ROWS]
        try:
            kernels = cls(onednn, net, pixels, rms)
            out = kernels(rows)
        except RuntimeError as e:
            log.warning("oneDNN's int8 kernels refused the Nature CNN (%s); acting in float32", e)
            return None
        with torch.no_grad():
            ref = float32_features(net, rows, pixels, rms)
        err = float((out - ref).abs().max()) / max(float(ref.max()), 1e-6)
        if not err <= MAX_ERROR:
            log.warning("the int8 Nature CNN is off by %.3g of its features' range; acting in float32", err)
            return None
        return kernels

    def _conv(self, i: int, q: torch.Tensor, scale: float, zero: int) -> tuple[torch.Tensor, float]:
        """Convolution `i` with its ReLU, as uint8 and its scale: straight to uint8 at HEADROOM over
        the last call's largest output where that clips nothing (no output at 255), else again in
        float32, scaled to its own range (module docstring)."""
        run = self._ops.qconv2d_pointwise
        packed, w_scale, w_zero, bias, geometry = self._convs[i]
        out_scale = self._out_scales[i]
        if out_scale is not None:
            out = run(q, scale, zero, packed, w_scale, w_zero, bias, *geometry, out_scale, 0, None, "relu", [], "")
            peak = int(out.amax())
            if peak < 255:
                self._out_scales[i] = max(peak, 1) * out_scale * HEADROOM / 255.0
                return out, out_scale
        self.rescaled += 1
        y = run(q, scale, zero, packed, w_scale, w_zero, bias, *geometry, 1.0, 0, torch.float32, "relu", [], "")
        out, out_scale = _to_uint8(y)
        self._out_scales[i] = out_scale * HEADROOM
        return out, out_scale

    def _input(self, x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        """The first kernel's channels-last uint8 input, its scale and zero point."""
        if self._standardized is not None:
            return self._standardized(x)
        if self._pixels:  # pixels as they are: no pass over them
            q, scale, zero = (x, 1 / 255.0, 0) if x.dtype == torch.uint8 else _signed_to_uint8(x / 255.0)
        else:
            q, scale, zero = _signed_to_uint8(x.float())
        return _channels_last(q), scale, zero

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        q, scale, zero = self._input(x)
        for i in range(len(self._convs)):
            (q, scale), zero = self._conv(i, q, scale, zero), 0
        packed, w_scale, w_zero, bias = self._fc
        return self._ops.qlinear_pointwise(q.reshape(len(x), -1), scale, 0, packed, w_scale, w_zero, bias,
                                           1.0, 0, torch.float32, "relu", [], "")
