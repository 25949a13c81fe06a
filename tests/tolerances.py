"""The one rule for comparing floats that two different computations produced.

Two computations of the same value by different shapes, batchings or paths (a batch against each
prompt alone, sparse against native, checkpointed against plain, bfloat16 against float32, torch
against a reference loop) add their terms in different orders, and which order a kernel takes
depends on the CPU, the thread count and the library build. A tolerance read off one machine fails
on the next; this one is derived from the computation instead.

Derivation. Let u = eps / 2 be the unit roundoff of the coarser dtype and u_acc that of the dtype
sums accumulate in (torch's CPU kernels accumulate float16 and bfloat16 in float32, their
``opmath`` type; other dtypes in themselves). A sum of n terms rounds n times; with the rounding
errors modelled as independent and zero-mean (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., §2.8 and §4.2: the worst case n·u is rarely approached, √n·u is the typical
growth), the computed sum differs from the exact one by a random error of standard deviation
about u_acc·√n·s, where s is the scale of the values the sum produces (for a dot product of terms
with random signs, √(Σ tᵢ²) ≈ |result|), and storing the result rounds once more (u·s). A
computation that chains sums of lengths n₁ … n_d (projections, attention, norms, a network's
layers) repeats this; independent errors add in quadrature, so one evaluation is off by
σ ≈ s·√(Σᵢ (u² + nᵢ·u_acc²)). Two evaluations in different orders differ by √2·σ, and the
largest of up to 10⁶ compared elements stays within 5.3 standard deviations of a Gaussian
(P(|z| > 5.3) ≈ 1e-7 per element). Hence

    atol = 8 · s · √(d · u² + (n₁ + … + n_d) · u_acc²),      8 ≥ √2 · 5.3,

which in float32 is 4 · eps · s · √(d + Σ nᵢ) and in bfloat16 (u = 2⁻⁸) is dominated by the
storage roundings, 8 · s · √d · 2⁻⁸. s = max |values| (the errors of a sum scale with its
terms, not with an entry that happens to cancel to zero) and rtol = 0. A long chain is counted
sum by sum below (``VLM_LOGITS``: every sum of the tiny models' forwards, layer by layer); a
short one as ``depth`` sums of at most ``reduction_len`` terms. The assumption that a
layer does not amplify the error beyond the scale of its output is what the kernel variants
(``make test-kernels``, docs/reliability.md) check: they record the observed difference / atol
of every comparison made through here when ``ARR_TOL_LOG`` names a file.

A negative control must fail by orders of magnitude more than the tolerance, or a tolerance wide
enough to hide a real error would pass: :func:`assert_far` checks that margin explicitly.

Identical computations (the same function on the same tensors and shapes) are compared exactly
(``torch.equal``), not through here.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import torch

SIGMAS = 8.0  # √2 (two evaluations) x 5.3 standard deviations (the largest of 10⁶ elements), rounded up
MARGIN = 100.0  # a negative control must differ by at least this many tolerances


REDUCED = (torch.float16, torch.bfloat16)  # stored in 16 bits, accumulated in float32 by torch's CPU kernels


def coarser(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype with the largest roundoff: the one whose evaluation bounds a comparison."""
    return max(dtypes, key=lambda d: torch.finfo(d).eps)


def reduction_atol(*values: torch.Tensor, reduction_len: int | Sequence[int], depth: int = 1,
                   dtype: torch.dtype | None = None, scale: float | None = None) -> float:
    """The absolute tolerance between two evaluations of ``values`` (the module docstring derives it).

    Args:
        values: the compared tensors; their largest magnitude is the scale s.
        reduction_len: n, the longest sum in the computation (a matmul's inner size, a sequence, a window), or
            the lengths n₁ … n_d of every sum the computation chains (then ``depth`` is not used).
        depth: how many sums of at most ``reduction_len`` terms the computation chains.
        dtype: whose roundoff applies; by default the coarser of the values' dtypes.
        scale: s, where the compared values are not the scale of the summed terms (a sum that cancels to zero:
            the mean of standardised values); by default max |values|.

    >>> reduction_atol(torch.tensor([1.0, -2.0]), reduction_len=15, depth=4)  # 4 · 2^-23 · √(4 · 16) · 2
    7.62939453125e-06
    >>> round(reduction_atol(torch.tensor([2.0]), reduction_len=1000, depth=4, dtype=torch.bfloat16), 6)  # 8·2·2·2^-8
    0.125
    """
    dtype = dtype or coarser(*(v.dtype for v in values))
    u = torch.finfo(dtype).eps / 2
    u_acc = torch.finfo(torch.float32).eps / 2 if dtype in REDUCED else u
    if scale is None:
        scale = max(float(v.detach().abs().max()) if v.numel() else 0.0 for v in values)
    sums = [reduction_len] * depth if isinstance(reduction_len, int) else list(reduction_len)
    return SIGMAS * scale * math.sqrt(len(sums) * u ** 2 + sum(sums) * u_acc ** 2)


def _log(kind: str, diff: float, atol: float) -> None:
    """Record one comparison for the kernel-variant report when ``ARR_TOL_LOG`` names a file."""
    path = os.environ.get("ARR_TOL_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        with open(path, "a") as f:
            f.write(json.dumps(dict(test=test, kind=kind, diff=diff, atol=atol)) + "\n")


def max_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.detach().double() - expected.detach().double()).abs().max()) if actual.numel() else 0.0


def assert_close_reduction(actual: torch.Tensor | float, expected: torch.Tensor | float, *,
                           reduction_len: int | Sequence[int],
                           depth: int = 1, dtype: torch.dtype | None = None, scale: float | None = None) -> float:
    """``actual`` equals ``expected`` within :func:`reduction_atol`; returns that tolerance.

    A Python float (a loss's ``.item()``) counts as float32, the dtype it was computed in.

    >>> a = torch.randn(64, generator=torch.Generator().manual_seed(0))
    >>> ones = torch.ones(64)
    >>> assert_close_reduction(a.sum().view(1), (a * ones).sum().view(1), reduction_len=64) > 0
    True
    """
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    atol = reduction_atol(actual, expected, reduction_len=reduction_len, depth=depth, dtype=dtype, scale=scale)
    assert actual.shape == expected.shape, f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}"
    _log("close", max_diff(actual, expected), atol)
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=atol, rtol=0)
    return atol


def assert_far(actual: torch.Tensor | float, expected: torch.Tensor | float, *, atol: float,
               margin: float = MARGIN) -> None:
    """A negative control: ``actual`` differs from ``expected`` by at least ``margin`` x ``atol`` somewhere.

    >>> assert_far(torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]), atol=1e-4)
    """
    diff = max_diff(torch.as_tensor(actual), torch.as_tensor(expected))
    _log("far", diff, atol)
    assert diff >= margin * atol, f"negative control too close: {diff:.3g} < {margin:g} x atol {atol:.3g}"


def transformer_layer(width: int, mlp: int, head_dim: int, seq: int) -> list[int]:
    """The sums one pre-norm transformer layer chains: the norm's mean and variance, q, k and v, the scores, the
    softmax's normaliser and its weighted sum over ``seq`` positions, the output projection, the second norm,
    the MLP's gate, input and output (a plain MLP has no gate: counted anyway)."""
    return [width, width, width, width, width, head_dim, seq, seq, width, width, width, width, width, mlp]


# The tiny VLMs' forwards (arr_coc/vlm/tiny.py: width 32, MLP 64, heads of 16, 2 tower + 2 language layers),
# every attention over at most 256 positions (the tests' prompts and tower segments are shorter).
_TINY = transformer_layer(32, 64, 16, 256)
# the patch embedding (Qwen3-VL: 3 x 2 x 16 x 16 = 1536 inputs; Qwen2: 1176, CLIP: 588), the tower, the merger
# or projector (a norm, then two linear maps over the 2 x 2 merged 128 features)
VLM_TOWER = [1536, *_TINY, *_TINY, 32, 32, 128, 128]
VLM_LANGUAGE = [*_TINY, *_TINY, 32, 32, 32]  # the layers, the final norm, the head
VLM_EMBEDS = dict(reduction_len=VLM_TOWER)
VLM_LOGITS = dict(reduction_len=VLM_TOWER + VLM_LANGUAGE)
VLM_LM = dict(reduction_len=VLM_LANGUAGE)  # the language model alone: both sides share the visual tokens
# the last layer's attention probabilities from the same input embeddings: layer 0, then layer 1's norm, q, k,
# the scores and the softmax
VLM_ATTENTION = dict(reduction_len=[*_TINY, 32, 32, 32, 32, 16, 256])
# an answer's cross-entropy: the logits, the log-softmax over the 128-token vocabulary (its max and sum) and
# the mean over at most 16 answer tokens; its gradient runs the same sums back
_LOSS = VLM_TOWER + VLM_LANGUAGE + [128, 128, 16]
VLM_LOSS = dict(reduction_len=_LOSS)
VLM_LOSS_GRAD = dict(reduction_len=2 * _LOSS)

# The ARR pipeline's relevance map (arr_coc/engine/pipeline.py): the canvas resize (at most 8 x 8 taps), grey, a 3 x 3
# filter, pooling 784 pixels to a cell, standardisation over the cells of the largest page the tests allocate
# (the receipt's 1855 cells: mean, variance), the query projection (384), the linear heads over the channels
# (fewer than 64) and the mix of 3 parts
_ARR = [64, 3, 9, 784, 2048, 2048, 384, 64, 3]
ARR_MAP = dict(reduction_len=_ARR)
# The scorers (arr_coc/engine/relevance.py) on the tests' inputs: the longest sum the query projection's 384 inputs;
# depth: the query projection, the linear heads, standardisation (mean, variance), the context softmax, the mix
SCORER = dict(reduction_len=384, depth=6)
# The texture channels (arr_coc/engine/pixel_channels.py) of the tests' 24 x 20 images: the longest sum the
# saliency's FFT over all 480 pixels; depth: grey, area resize, FFT, log amplitude, its box blur, inverse FFT, power,
# 7 x 7 blur, the per-image normalisation, and the 28 px pooling to cells
TEXTURE = dict(reduction_len=512, depth=10)
# The clip channel on the tests' tiny CLIP / SigLIP (2 layers, width 32, 8 px patches): the longest sum the patch
# embedding's 3 x 8 x 8 = 192 inputs; depth: the patch embedding, 2 layers of 9 reductions, the final norm and
# projection (21), then the cosine with the question (normalise, dot), the centring, the upsampling and the
# per-image normalisation (5), and slack for the text tower's own norm and projection (4)
CLIP_MAP = dict(reduction_len=192, depth=30)
# The objects channel: EfficientNet-Lite0 (16 inverted-residual blocks of 3 convolutions, the stem and the head:
# about 50), then the query coupling and the per-image normalisation; the longest sum a 1 x 1 projection over
# 1152 channels
OBJECTS = dict(reduction_len=1152, depth=60)
# Training the scorer against the tiny VLM's answer loss (arr_coc/train): the relevance map, the soft top-K
# weights (the bisection's sum over the cells) and the answer loss forward; the gradient runs both chains back.
# Weights after k optimiser steps: each step's gradient error enters the update (k x TRAIN_GRAD's sums).
TRAIN_LOSS = dict(reduction_len=_ARR + [2048] + _LOSS)
TRAIN_GRAD = dict(reduction_len=2 * TRAIN_LOSS["reduction_len"])
# A canvas's pixels: one antialiased resize, at most 8 x 8 taps for the tests' reductions of up to 4x
CANVAS = dict(reduction_len=64, depth=1)


def report(logs: list[str]) -> str:
    """A markdown table from ``ARR_TOL_LOG`` files, one per kernel variant (named by the file): per test file, the
    worst observed difference / tolerance of its comparisons under each variant, and the smallest difference /
    tolerance of its negative controls under any."""
    names = [os.path.basename(p).removesuffix(".jsonl") for p in logs]
    worst: dict[str, dict[str, float]] = {}
    counts: dict[str, list[int]] = {}
    margin: dict[str, float] = {}
    for name, path in zip(names, logs):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                group = r["test"].split("::")[0]
                ratio = r["diff"] / r["atol"] if r["atol"] else (0.0 if r["diff"] == 0 else math.inf)
                c = counts.setdefault(group, [0, 0])
                if r["kind"] == "close":
                    c[0] += 1
                    worst.setdefault(group, {})[name] = max(worst.get(group, {}).get(name, 0.0), ratio)
                else:
                    c[1] += 1
                    margin[group] = min(margin.get(group, math.inf), ratio)
    out = ["| tests | comparisons, controls (all runs) | " + " | ".join(names) + " | least control diff / tol |",
           "|---|---:|" + "---:|" * len(names) + "---:|"]
    for group in sorted(counts):
        cells = [f"{worst[group][n]:.2g}" if n in worst.get(group, {}) else "-" for n in names]
        least = f"{margin[group]:.3g}" if group in margin else "-"
        out.append(f"| {group} | {counts[group][0]}, {counts[group][1]} | " + " | ".join(cells) + f" | {least} |")
    return "\n".join(out)


def probe() -> str:
    """Which kernels this process runs: ATen's CPU capability, torch's threads, and a digest of the bits of a few
    ops (a matmul, a batched matmul, a convolution, attention, softmax, sums of 4M elements, layer norm, GELU) on fixed
    inputs. Two variants whose digests of an op differ ran that op through other kernels or another order."""
    import hashlib

    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 300, generator=g), torch.randn(300, 53, generator=g)
    x, w = torch.randn(2, 3, 33, 33, generator=g), torch.randn(8, 3, 5, 5, generator=g)
    q, v = torch.randn(1, 4, 17, 32, generator=g), torch.randn(8, 4_000_000, generator=g)
    outs = {"matmul": a @ b, "bmm": torch.bmm(a.expand(3, -1, -1).contiguous(), b.expand(3, -1, -1).contiguous()),
            "conv2d": F.conv2d(x, w), "sdpa": F.scaled_dot_product_attention(q, q, q), "softmax": a.softmax(-1),
            "sum4M": torch.stack([row.sum() for row in v]), "layer_norm": F.layer_norm(a, (300,)), "gelu": F.gelu(a)}
    bits = " ".join(f"{k}={hashlib.sha1(t.contiguous().numpy().tobytes()).hexdigest()[:6]}" for k, t in outs.items())
    return f"{torch.backends.cpu.get_cpu_capability()} threads={torch.get_num_threads()} {bits}"


if __name__ == "__main__":  # python tests/tolerances.py LOG... | --probe: what docs/reliability.md quotes
    import sys

    print(probe() if sys.argv[1:] == ["--probe"] else report(sys.argv[1:]))
