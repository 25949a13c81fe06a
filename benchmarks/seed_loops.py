"""The design seeds' per-item loop versions of each stage, kept only as the benchmark's reference.

They follow the sketches in the seeds (Part 33 texture, Part 47 scorer, Part 13 stratified sampler,
Part 48 NMS and extraction): one image at a time, NumPy where the seeds used it (spectral residual
like OpenCV's), Python loops over strata and picks. The distance-to-edge channel is arr_coc's own
(the same exact transform on the same reduced grid), so the texture comparison measures batching, not
two different distance transforms. They compute the same quantities as arr_coc's batched stages, not
bit-identical values.
"""
from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi
import torch
import torch.nn.functional as F
from kornia.filters import gaussian_blur2d, laplacian, sobel

from arr_coc.engine.texture import compute_texture


def _norm(x: torch.Tensor) -> torch.Tensor:
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 1e-4 else torch.zeros_like(x)


def _spectral_residual_numpy(gray: np.ndarray) -> np.ndarray:
    """Hou & Zhang 2007 at 64 px wide, as OpenCV's StaticSaliencySpectralResidual does it (CPU)."""
    h, w = gray.shape
    small = np.asarray(torch.nn.functional.interpolate(torch.from_numpy(gray)[None, None], size=(max(1, h * 64 // w), 64),
                                                       mode="area")[0, 0])
    spec = np.fft.fft2(small)
    log_amp = np.log(np.abs(spec) + 1e-3)
    residual = log_amp - ndi.uniform_filter(log_amp, 3, mode="wrap")
    sal = np.abs(np.fft.ifft2(np.exp(residual + 1j * np.angle(spec)))) ** 2
    sal = ndi.gaussian_filter(sal, 2.0)
    return np.asarray(F.interpolate(torch.from_numpy(sal).float()[None, None], size=(h, w), mode="bilinear")[0, 0])


def texture_seed_loop(pixels: torch.Tensor) -> torch.Tensor:
    """Seed Part 33 ``generate_texture_simplified``, one image at a time -> [B, 13, H, W]."""
    out = []
    for image in pixels:  # [3, H, W]
        _, H, W = image.shape
        tex = torch.zeros(13, H, W)
        tex[0:3] = image
        y, x = torch.meshgrid(torch.linspace(0, 1, H), torch.linspace(0, 1, W), indexing="ij")
        tex[3], tex[4] = y, x
        tex[5] = torch.sqrt((y - 0.5) ** 2 + (x - 0.5) ** 2) / np.sqrt(0.5)
        gray = image.mean(0, keepdim=True)[None]  # [1, 1, H, W]
        edges = _norm(sobel(gray)[0, 0])
        tex[6], tex[7] = edges, 1 - edges
        tex[8] = _norm(laplacian(gray, 3)[0, 0].abs())
        tex[9] = gaussian_blur2d(gray, (9, 9), (2.0, 2.0))[0, 0]
        tex[10] = 0.0  # motion: still image
        tex[11] = _norm(torch.from_numpy(_spectral_residual_numpy(gray[0, 0].numpy())))
        tex[12] = compute_texture(image[None], ("distance",))[0, 0]  # the batched version's transform, per image
        out.append(tex)
    return torch.stack(out)


def stratified_seed_loop(relevance: torch.Tensor, k: int, grid=(4, 4)) -> torch.Tensor:
    """Seed Part 13 ``StratifiedTokenSampler``: per image, Python loops over strata -> [B, K] flat indices."""
    out = []
    B, Hc, Wc = relevance.shape
    ys, xs = torch.meshgrid(torch.arange(Hc), torch.arange(Wc), indexing="ij")
    positions = torch.stack([xs.flatten() / Wc, ys.flatten() / Hc], 1)  # (x, y) in [0, 1) as the seed has it
    gh, gw = grid
    for b in range(B):
        scores = relevance[b].flatten() - relevance[b].min() + 1e-6
        sx = (positions[:, 0] * gw).long().clamp(0, gw - 1)
        sy = (positions[:, 1] * gh).long().clamp(0, gh - 1)
        sid = sy * gw + sx
        importance = torch.zeros(gh * gw)
        for i in range(gh * gw):
            importance[i] = scores[sid == i].sum()
        alloc = (importance / importance.sum() * (k - gh * gw)).long() + 1
        while alloc.sum() > k:
            alloc[torch.argmax(alloc)] -= 1
        while alloc.sum() < k:
            alloc[torch.argmax(importance)] += 1
        selected: list[int] = []
        for i in range(gh * gw):
            members = torch.where(sid == i)[0]
            n = min(int(alloc[i]), len(members))
            selected.extend(members[torch.topk(scores[members], n).indices].tolist())
        out.append(torch.tensor(selected[:k]))
    return out


def nms_seed_loop(relevance: torch.Tensor, k: int, min_distance: int = 1) -> list[torch.Tensor]:
    """Seed Part 48 ``select_saccades_with_nms``: per image, one Python step per pick."""
    out = []
    B, H, W = relevance.shape
    for b in range(B):
        scores = relevance[b] - relevance[b].min() + 1e-6
        picks = []
        for _ in range(k):
            s, idx = scores.flatten().max(0)
            if s == 0:
                break
            y, x = divmod(int(idx), W)
            picks.append((y, x))
            scores[max(0, y - min_distance):y + min_distance + 1, max(0, x - min_distance):x + min_distance + 1] = 0
        out.append(torch.tensor(picks))
    return out
