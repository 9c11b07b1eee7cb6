"""The bf16 Nature CNN through oneDNN's fused CPU kernels: each convolution with its ReLU in one
call, the fully connected layer's weights packed once per version into the blocked layout its
kernel reads.

Through nn.Conv2d / nn.Linear every bf16 call re-orders its weights into that layout (3.2 MB for
the 3136x512 layer, read at an actor's 8 rows) and each ReLU is a pass of its own. These are the
kernels torch.compile's CPU freezing pass emits (inductor's fx_passes/mkldnn_fusion.py:
`mkldnn._reorder_linear_weight`, then `mkldnn._linear_pointwise` / `_convolution_pointwise`),
called directly, without compiling: the same bf16 products with float32 accumulation. Packing the
convolutions' weights too was no faster (docs/benchmarks.md). Private ops of the pinned torch:
`FusedNatureCNN.build` returns None where they are missing or refuse the network, and the
module path runs."""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

log = logging.getLogger(__name__)

_TRIED: list = []  # a trial call ran (FusedNatureCNN.build)
_LAYERS = (nn.Conv2d, nn.ReLU, nn.Conv2d, nn.ReLU, nn.Conv2d, nn.ReLU, nn.Flatten, nn.Linear, nn.ReLU)


def _ops():
    ops = getattr(torch.ops, "mkldnn", None)
    needed = ("_convolution_pointwise", "_linear_pointwise", "_reorder_linear_weight", "_is_mkldnn_bf16_supported")
    if not torch.backends.mkldnn.is_available() or ops is None or not all(hasattr(ops, n) for n in needed):
        return None
    return ops if ops._is_mkldnn_bf16_supported() else None  # AVX-512 BW/VL/DQ at least


class FusedNatureCNN:
    """A snapshot of `net`'s bf16 weights as oneDNN kernels: build again after they change."""

    def __init__(self, ops, net: nn.Sequential, batch: int):
        self._ops = ops
        self._convs = [(m.weight.detach(), m.bias.detach(), list(m.padding), list(m.stride), list(m.dilation),
                        m.groups) for m in net if isinstance(m, nn.Conv2d)]
        fc = net[7]
        self._fc = (ops._reorder_linear_weight(fc.weight.detach(), batch), fc.bias.detach())

    @classmethod
    def build(cls, net: nn.Sequential, x: torch.Tensor) -> Optional[FusedNatureCNN]:
        """The kernels for `net` (a NatureCNN's `net` in bf16) packed for batches like `x`, or None
        where they cannot run here."""
        ops = _ops()
        if ops is None or tuple(type(m) for m in net) != _LAYERS or net[0].weight.dtype != torch.bfloat16:
            return None
        try:
            kernels = cls(ops, net, len(x))
            if not _TRIED:  # once per process: a CPU whose oneDNN has no bf16 kernels fails here
                kernels(x[:1])
                _TRIED.append(True)
            return kernels
        except RuntimeError as e:
            log.warning("oneDNN's fused bf16 kernels refused the Nature CNN (%s); using the module path", e)
            return None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        conv, linear = self._ops._convolution_pointwise, self._ops._linear_pointwise
        for w, b, padding, stride, dilation, groups in self._convs:
            x = conv(x, w, b, padding, stride, dilation, groups, "relu", [], "")
        return linear(x.flatten(1), *self._fc, "relu", [], "")
