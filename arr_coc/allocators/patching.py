"""Adaptive patching: allocators whose tokens stand for 1x, 2x, 4x ... squares of cells under a token budget.

A sampler (`arr_coc.engine.samplers`) spends one token per cell. Here one token may cover a size x size square of
cells, resized to one cell: coarse where little happens, fine where the saliency is. Two families:
`saliency_patches` (greedy non-overlapping squares, exactly K) and `quadtree_patches` (hierarchical
splits of a tiling of the image, at most K). Plus what batching variable token counts needs
(`bucket_by_tokens`, `pad_tokens`) and what the VLM would see (`render_patches`, `patch_coverage`).

Notation: B images on a padded canvas of Hc x Wc token cells, `cell` pixels per cell side, K tokens.
    boxes  [B, K, 3] (y, x, size) in cells, int64: the size x size cells whose top-left cell is (y, x);
           size 0 marks padding (an image with fewer tokens than the widest of its batch).
"""
from __future__ import annotations

import heapq
import math
import operator
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from kornia.color import rgb_to_grayscale
from kornia.filters import sobel
from torch import Tensor

from arr_coc.engine.imageops import resize, shrink_squares  # noqa: F401  (shrink_squares re-exported for the allocators' users)
from arr_coc.engine.samplers import check_budget, shift_nonnegative, valid_extent
from arr_coc.registry import Registry

# A pixel is a strong edge at a normalised Sobel magnitude >= 0.05, a 10 % contrast step (a full black/white
# step gives 0.5): ink on paper and object borders pass, JPEG noise and soft shading (1-2 %) do not.
EDGE_STRENGTH = 0.05
SIZE_PRIOR = 2.0  # the registry's alpha of `saliency_patches`: best reading on validation images (tune_patches.py)
# Luma levels of the entropy criterion: enough to tell ink, paper and shading apart, few enough that a
# one-cell histogram (28 x 28 px) is not all singletons.
ENTROPY_BINS = 16

Patcher = Callable[..., "Patches"]  # (relevance [B, Hc, Wc], k, valid=None, pixels=None) -> Patches
PATCHERS: Registry[Patcher] = Registry("patcher")


class BudgetTooSmallError(ValueError):
    """A patch allocator cannot start at this budget: ``minimum`` tokens is the least it can send.

    A quadtree must send its whole starting tiling before it refines anything, so below that count
    there is no allocation at all (callers skip the budget or ask for a larger one).
    """

    def __init__(self, message: str, k: int, minimum: int) -> None:
        super().__init__(message)
        self.k, self.minimum = k, minimum


@dataclass
class Patches:
    """Variable-size patches per image, one token each, ordered by score (high -> low); padding last."""

    boxes: Tensor  # [B, K, 3] (y, x, size) in cells, int64
    scores: Tensor  # [B, K] the allocator's score of each patch (0 on padding)

    @property
    def tokens(self) -> int:
        """K, the width of the batch (per-image counts in `counts` when images differ)."""
        return self.boxes.shape[1]

    @property
    def counts(self) -> Tensor:
        """Real patches per image `[B]` (rows with size > 0)."""
        return (self.boxes[..., 2] > 0).sum(1)

    def mask(self, hc: int, wc: int) -> Tensor:
        """Which patch size covers each cell, `[B, hc, wc]` int64, 0 where no patch does.

        Example:
            >>> Patches(torch.tensor([[[0, 0, 2], [1, 2, 1]]]), torch.ones(1, 2)).mask(2, 3).tolist()
            [[[2, 2, 0], [2, 2, 1]]]
        """
        y, x, s = self.boxes.unbind(-1)  # [B, K] each
        if bool(((s > 0) & ((y < 0) | (x < 0) | (y + s > hc) | (x + s > wc))).any()):
            raise ValueError(f"some box does not fit a {hc}x{wc} cell grid: {self.boxes.tolist()}")
        side = int(s.max()) if s.numel() else 0
        d = torch.arange(max(side, 1), device=s.device)
        dy, dx = d.repeat_interleave(len(d)), d.repeat(len(d))  # [S*S] offsets inside the largest box
        inside = (dy < s[..., None]) & (dx < s[..., None])  # [B, K, S*S]
        flat = torch.where(inside, (y[..., None] + dy) * wc + x[..., None] + dx, hc * wc)  # sink column hc*wc
        out = torch.zeros(s.shape[0], hc * wc + 1, dtype=torch.long, device=s.device)
        out.scatter_(1, flat.flatten(1), s[..., None].expand_as(flat).flatten(1))
        return out[:, :-1].view(-1, hc, wc)


def _box_sums(x: Tensor, size: int, stride: int) -> Tensor:
    """Sums over size x size windows of `[B, C, h, w]` -> `[B, C, h', w']` (sum, not mean: exact counts)."""
    return F.avg_pool2d(x, size, stride, divisor_override=1)


# ----------------------------------------------------------------------------- saliency maps
def edge_density(pixels: Tensor, cell: int, strength: float = EDGE_STRENGTH) -> Tensor:
    """Share of strong-gradient pixels in each cell, `[B, Hc, Wc]` in [0, 1]: the classic query-blind saliency.

    Args:
        pixels: `[B, 3, H, W]` float in [0, 1], H and W multiples of `cell`.
        cell: pixels per cell side.
        strength: normalised Sobel magnitude (kornia) at which a pixel counts as an edge.

    Example:
        >>> board = ((torch.arange(8)[:, None] // 2 + torch.arange(8) // 2) % 2).float()  # 2 px squares
        >>> px = torch.zeros(1, 3, 8, 24); px[..., 16:] = board
        >>> edge_density(px, 8)[0, 0].tolist()  # flat, flat beside the board's edge, checkerboard
        [0.0, 0.109375, 0.953125]
    """
    if pixels.ndim != 4 or pixels.shape[1] != 3 or pixels.shape[2] % cell or pixels.shape[3] % cell:
        raise ValueError(f"pixels must be [B, 3, H, W] with H, W multiples of cell={cell}, got {tuple(pixels.shape)}")
    strong = (sobel(rgb_to_grayscale(pixels)) >= strength).to(pixels.dtype)  # [B, 1, H, W]
    return F.avg_pool2d(strong, cell)[:, 0]


def attention_saliency(attn: Tensor, grid: tuple[int, int]) -> Tensor:
    """Saliency `[B, gh, gw]` from a vision encoder's attention: the attention each patch token receives.

    Args:
        attn: `[B, heads, N, N]` attention weights (mean over heads and query rows of each key column) or
            `[B, N]` one row, e.g. the CLS token's. Prefix tokens (CLS, registers) come first and are
            dropped: the last gh * gw tokens are the patches in raster order.
        grid: (gh, gw) patch grid of the encoder (`F.interpolate` the result if the canvas grid differs).

    Example:
        >>> a = torch.full((1, 5), 0.1); a[0, 3] = 0.6  # CLS + 2x2 patches; patch 2 gets the attention
        >>> attention_saliency(a, (2, 2))[0].argmax().item()
        2
    """
    gh, gw = grid
    received = attn.mean(dim=(1, 2)) if attn.ndim == 4 and attn.shape[2] == attn.shape[3] else attn  # [B, N]
    if received.ndim != 2:
        raise ValueError(f"attn must be [B, heads, N, N] or [B, N], got {tuple(attn.shape)}")
    if received.shape[1] < gh * gw:
        raise ValueError(f"attn has N={received.shape[1]} tokens, fewer than the {gh}x{gw} grid's {gh * gw} patches")
    return received[:, received.shape[1] - gh * gw :].reshape(-1, gh, gw)


# ----------------------------------------------------------------------------- greedy saliency patches
def saliency_patches(
    saliency: Tensor, k: int, valid: Tensor | None = None, sizes: Sequence[int] = (1, 2, 4), size_prior: float = 1.0
) -> Patches:
    """Exactly K non-overlapping square patches, greedily by saliency mass per token.

    Candidates are the squares of every size fully inside the valid cells and aligned to their size from
    the corner of the valid extent ((y - y0) % size == 0). A candidate scores `sum(mass) / size**alpha`,
    alpha = `size_prior`, mass = saliency shifted to min 0 over valid cells. A token of side `size` sees
    size^2 cells at 1/size of the resolution per axis; alpha = 1 discounts the mass by that linear loss:
    saliency concentrated in one cell scores highest as a 1x1 patch (v > v / 2), saliency spread evenly
    highest as a large one (16 v / 4 > v). alpha = 2 ranks by mean, alpha = 0 by sum.
    Picks go highest first (ties to the larger, then upper-left patch), skipping overlaps and any patch
    that would leave fewer free cells than tokens still to place, so K always fits: size 1 must be among
    `sizes`, and a pick's score never exceeds an earlier one's. The loop runs over K, batched over images.

    Args:
        saliency: `[B, Hc, Wc]` any saliency: the pipeline's relevance, `edge_density`, `attention_saliency`.
        k: tokens per image; valid: `[B, Hc, Wc]` bool (None: all cells).
        sizes: patch sides in cells; size_prior: alpha above.

    Raises:
        ValueError: bad shapes or sizes, or K above some image's valid-cell count.

    Example:
        >>> sal = torch.zeros(1, 4, 4); sal[0, 0, 0] = 1.0; sal[0, 2:, 2:] = 0.5
        >>> saliency_patches(sal, 3).boxes[0].tolist()
        [[2, 2, 2], [0, 0, 1], [0, 2, 2]]
    """
    valid = check_budget(saliency, k, valid)
    sizes = sorted({int(s) for s in sizes}, reverse=True)  # larger first, so ties go to the larger patch
    if 1 not in sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive ints including 1 (so exactly K patches always fit), got {sizes}")
    b, hc, wc = saliency.shape
    mass = shift_nonnegative(saliency, valid)[0][:, None]  # [B, 1, Hc, Wc]
    y0, x0, _, _ = valid_extent(valid)
    ys, xs, ss, score, ok = [], [], [], [], []
    for s in sizes:
        if s > min(hc, wc):
            continue
        gy, gx = torch.meshgrid(torch.arange(hc - s + 1), torch.arange(wc - s + 1), indexing="ij")
        gy, gx = gy.flatten().to(valid.device), gx.flatten().to(valid.device)  # [M_s] every window's corner
        inside = _box_sums(valid[:, None].to(mass.dtype), s, 1).flatten(1) == s * s  # [B, M_s]
        aligned = ((gy[None] - y0[:, None]) % s == 0) & ((gx[None] - x0[:, None]) % s == 0)
        ys.append(gy), xs.append(gx), ss.append(torch.full_like(gy, s)), ok.append(inside & aligned)
        score.append(_box_sums(mass, s, 1).flatten(1) / s**size_prior)
    cy, cx, cs = torch.cat(ys), torch.cat(xs), torch.cat(ss)  # [M] candidate boxes
    score, avail = torch.cat(score, 1), torch.cat(ok, 1)  # [B, M]
    free = valid.flatten(1).sum(1)  # [B] cells no pick covers yet
    rows = torch.arange(b, device=valid.device)
    picks = []
    for t in range(k):
        fits = avail & (free[:, None] - cs[None] ** 2 >= k - t - 1)  # a 1x1 always fits: free >= k - t holds
        pick = torch.where(fits, score, -math.inf).argmax(1)  # [B] first maximum, per torch.argmax's contract
        py, px, ps = cy[pick, None], cx[pick, None], cs[pick, None]  # [B, 1]
        avail &= ~((cy < py + ps) & (py < cy + cs) & (cx < px + ps) & (px < cx + cs))
        free = free - ps[:, 0] ** 2
        picks.append(pick)
    pick = torch.stack(picks, 1)  # [B, K]
    return Patches(torch.stack((cy[pick], cx[pick], cs[pick]), -1), score[rows[:, None], pick])


# ----------------------------------------------------------------------------- quadtree
def _cell_stats(criterion: str, importance: Tensor, valid: Tensor, pixels: Tensor | None) -> Tensor:
    """Per-cell statistics `[B, F, Hc, Wc]` that add up over a square and give its importance."""
    if criterion == "relevance":
        return shift_nonnegative(importance, valid)[0][:, None]
    if pixels is None:
        raise ValueError(f"criterion {criterion!r} reads pixel luminance: pass pixels=[B, 3, H, W]")
    b, hc, wc = importance.shape
    cell = pixels.shape[-2] // hc if pixels.ndim == 4 else 0
    if pixels.ndim != 4 or pixels.shape[:2] != (b, 3) or cell == 0 or pixels.shape[2:] != (hc * cell, wc * cell):
        raise ValueError(f"pixels must be [{b}, 3, cell * {hc}, cell * {wc}], got {tuple(pixels.shape)}")
    luma = rgb_to_grayscale(pixels).double()  # [B, 1, H, W]; float64 so sum(y^2) - sum(y)^2 / n cancels cleanly
    if criterion == "variance":
        return _box_sums(torch.cat((torch.ones_like(luma), luma, luma**2), 1), cell, cell)  # n, sum y, sum y^2
    level = (luma[:, 0] * ENTROPY_BINS).long().clamp(0, ENTROPY_BINS - 1)  # [B, H, W]
    cy = torch.arange(pixels.shape[2], device=luma.device)[:, None] // cell
    cx = torch.arange(pixels.shape[3], device=luma.device)[None, :] // cell
    bin_ = ((torch.arange(b, device=luma.device)[:, None, None] * hc + cy) * wc + cx) * ENTROPY_BINS + level
    hist = torch.bincount(bin_.flatten(), minlength=b * hc * wc * ENTROPY_BINS).double()
    return hist.view(b, hc, wc, ENTROPY_BINS).permute(0, 3, 1, 2)  # bincount avoids a [B, bins, H, W] one-hot


def _importance(criterion: str, sums: Tensor) -> Tensor:
    """A square's importance `[h', w']` from its summed statistics `[F, h', w']`; extensive (grows with area)."""
    if criterion == "relevance":
        return sums[0]
    if criterion == "variance":  # squared error of the square's flat approximation: n * var
        return sums[2] - sums[1] ** 2 / sums[0]
    n = sums.sum(0)  # entropy in bits per pixel times pixels: the bits to code the square's luma levels
    return -(sums * torch.log2(sums.clamp_min(1) / n)).sum(0)


def _tiling(h: int, w: int, cap: int) -> list[tuple[int, int, int]]:
    """Squares (y, x, size) tiling an h x w rectangle exactly, each aligned to its size: the largest power
    of two <= min(h, w), capped, on a grid, then the right and bottom remainders the same way."""
    if h == 0 or w == 0:
        return []
    s = min(cap, 1 << (min(h, w).bit_length() - 1))
    nh, nw = h // s, w // s
    tiles = [(i * s, j * s, s) for i in range(nh) for j in range(nw)]
    right = [(y, nw * s + x, t) for y, x, t in _tiling(nh * s, w - nw * s, cap)]
    return tiles + right + [(nh * s + y, x, t) for y, x, t in _tiling(h - nh * s, w, cap)]


def quadtree_patches(
    importance: Tensor,
    k: int,
    valid: Tensor | None = None,
    criterion: str = "variance",
    pixels: Tensor | None = None,
    max_size: int = 8,
) -> Patches:
    """Quadtree leaves that tile each valid rectangle, refined where the importance is, within K tokens.

    Start from `_tiling` of the valid extent (squares of side min(max_size, largest power of two <= the
    shorter side), smaller squares filling the borders), then repeatedly split the leaf of highest
    importance into its 4 quadrants while the count stays <= K (1x1 leaves cannot split; ties to the upper
    left). A split adds 3 tokens, so the count is start + 3m: up to 2 tokens of the budget may stay unused.
    Importance grows with area, so a large busy leaf splits before a small one:
    `"variance"` n * var(luma) over the leaf's n pixels; `"entropy"` n * entropy of the luma over
    `ENTROPY_BINS` levels (both need `pixels`, `[B, 3, H, W]`); `"relevance"` summed relevance shifted to
    min 0 (`importance`, query-aware). `max_size` (a power of two; default 8) caps a leaf: its one token is
    the square shrunk 8x per axis (224 px into one 28 px cell); coarser, a token carries little beyond the
    leaf's mean colour. Images with fewer leaves than the widest of the batch are padded with size 0.

    Raises:
        BudgetTooSmallError: K below the starting tiling's count (``err.minimum``).
        ValueError: bad shapes or criterion, a valid mask that is not one rectangle per image.

    Example:
        >>> rel = torch.zeros(1, 4, 4); rel[0, 0, 0] = 1.0
        >>> p = quadtree_patches(rel, 7, criterion="relevance")
        >>> sorted(p.boxes[0].tolist())
        [[0, 0, 1], [0, 1, 1], [0, 2, 2], [1, 0, 1], [1, 1, 1], [2, 0, 2], [2, 2, 2]]
    """
    valid, k = check_budget(importance, 1, valid), operator.index(k)  # K=1: shapes and NaNs only, K may exceed cells
    if criterion not in ("variance", "entropy", "relevance"):
        raise ValueError(f"criterion must be 'variance', 'entropy' or 'relevance', got {criterion!r}")
    if max_size < 1 or max_size & (max_size - 1):
        raise ValueError(f"max_size must be a power of two >= 1, got {max_size}")
    stats = _cell_stats(criterion, importance, valid, pixels)  # [B, F, Hc, Wc]
    boxes, scores = [], []
    for b, (y0, x0, h, w) in enumerate(zip(*(v.tolist() for v in valid_extent(valid)))):
        if int(valid[b].sum()) != h * w:
            raise ValueError(f"quadtree_patches tiles a rectangle, but image {b}'s {int(valid[b].sum())} valid cells "
                             f"do not fill their {h}x{w} extent; pass a padded-canvas mask")
        leaves = _tiling(h, w, max_size)
        if len(leaves) > k:
            raise BudgetTooSmallError(f"budget K={k} is below the {len(leaves)} starting squares of image {b}'s "
                                      f"{h}x{w} cells; raise K or max_size", k, len(leaves))
        crop = stats[b, :, y0 : y0 + h, x0 : x0 + w]
        table = {}  # size -> importance of every aligned square of that size, as nested lists for cheap lookups
        for s in (1 << i for i in range(max(t for _, _, t in leaves).bit_length())):
            table[s] = _importance(criterion, _box_sums(crop[None], s, s)[0]).tolist()
        heap = [(-table[s][y // s][x // s], y, x, s) for y, x, s in leaves if s > 1]
        heapq.heapify(heap)
        done = [(y, x, s) for y, x, s in leaves if s == 1]
        count = len(leaves)
        while heap and count + 3 <= k:
            _, y, x, s = heapq.heappop(heap)
            half = s // 2
            for cy, cx in ((y, x), (y, x + half), (y + half, x), (y + half, x + half)):
                if half > 1:
                    heapq.heappush(heap, (-table[half][cy // half][cx // half], cy, cx, half))
                else:
                    done.append((cy, cx, 1))
            count += 3
        leaves = done + [(y, x, s) for _, y, x, s in heap]
        score = [table[s][y // s][x // s] for y, x, s in leaves]
        order = sorted(range(len(leaves)), key=lambda i: (-score[i], leaves[i][0], leaves[i][1]))
        boxes.append(torch.tensor([(y0 + leaves[i][0], x0 + leaves[i][1], leaves[i][2]) for i in order]))
        scores.append(torch.tensor([score[i] for i in order], dtype=importance.dtype))
    pad = torch.nn.utils.rnn.pad_sequence  # padding rows are (0, 0, 0): size 0
    return Patches(pad(boxes, batch_first=True).to(valid.device), pad(scores, batch_first=True).to(valid.device))


# ----------------------------------------------------------------------------- batching variable counts
def bucket_by_tokens(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group item indices of similar token counts so each padded batch holds <= max_tokens tokens.

    Items are sorted by length (stable) and cut greedily: an item joins the current bucket while
    (bucket size + 1) * its length (the longest so far) <= max_tokens. Every index appears exactly once.
    An item longer than max_tokens on its own gets a bucket of its own: no smaller batch exists, and
    dropping it silently would lose data (truncate or raise max_tokens upstream if that does not fit).

    Example:
        >>> bucket_by_tokens([5, 1, 4, 2, 9], 8)
        [[1, 3], [2], [0], [4]]
    """
    if max_tokens < 1 or any(n < 0 for n in lengths):
        raise ValueError(f"need max_tokens >= 1 and lengths >= 0, got {max_tokens} and {list(lengths)}")
    buckets: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if buckets and (len(buckets[-1]) + 1) * lengths[i] <= max_tokens:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def pad_tokens(tokens: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Stack `[N_i, D]` token lists into `[B, Nmax, D]` (zeros after each) and a `[B, Nmax]` mask, True on real tokens.

    Example:
        >>> x, m = pad_tokens([torch.ones(2, 3), torch.ones(1, 3)])
        >>> tuple(x.shape), m.tolist()
        ((2, 2, 3), [[True, True], [True, False]])
    """
    if not tokens or any(t.ndim != 2 or t.shape[1] != tokens[0].shape[1] for t in tokens):
        raise ValueError(f"need a non-empty list of [N_i, D] tensors, one D, got {[tuple(t.shape) for t in tokens]}")
    lengths = torch.tensor([len(t) for t in tokens], device=tokens[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(list(tokens), batch_first=True)
    return padded, torch.arange(padded.shape[1], device=lengths.device)[None] < lengths[:, None]


# ----------------------------------------------------------------------------- what the VLM sees
def render_patches(pixels: Tensor, boxes: Tensor, cell: int, background: Tensor | None = None) -> Tensor:
    """One image `[3, H, W]` as the VLM receives it: each patch shrunk to one cell and blown up onto its area.

    A patch is resized to cell x cell px (bilinear, antialiased, as a VLM processor shrinks an image) and
    back (bilinear); 1x1 patches pass through bit-exact. Patches are pasted over `background`, e.g.
    `arr_coc.eval.reading.gestalt_view(pixels, cell, grid)` for what arr-coc sends; default black (nothing seen).

    Args:
        pixels: `[3, H, W]` float in [0, 1].
        boxes: `[K, 3]` (y, x, size) in cells, one image's `Patches.boxes[b]`; size-0 rows are skipped.
        cell: pixels per cell side.
        background: `[3, H, W]` or None.

    Example:
        >>> px = torch.rand(3, 8, 8)
        >>> out = render_patches(px, torch.tensor([[0, 0, 1], [0, 2, 2]]), 2)
        >>> torch.equal(out[:, :2, :2], px[:, :2, :2]), out[:, 4:].abs().sum().item()
        (True, 0.0)
    """
    if pixels.ndim != 3 or boxes.ndim != 2 or boxes.shape[1] != 3:
        raise ValueError(f"need pixels [3, H, W] and boxes [K, 3], got {tuple(pixels.shape)} and {tuple(boxes.shape)}")
    out = torch.zeros_like(pixels) if background is None else background.clone()
    if out.shape != pixels.shape:
        raise ValueError(f"background {tuple(out.shape)} must match pixels {tuple(pixels.shape)}")
    boxes = boxes[boxes[:, 2] > 0]
    if len(boxes) == 0:
        return out
    for (y, x, s), small in zip(boxes.tolist(), shrink_squares(pixels, boxes, cell)):
        area = (slice(None), slice(y * cell, (y + s) * cell), slice(x * cell, (x + s) * cell))
        out[area] = small if s == 1 else resize(small, (s * cell, s * cell))
    return out


def patch_coverage(boxes: Tensor, answer: Tensor) -> dict[int, Tensor]:
    """Share of the answer's cells seen at each patch size: `{size: [B]}`, size 0 = not covered by any patch.

    Args:
        boxes: `[B, K, 3]` (or one image's `[K, 3]`) (y, x, size) in cells.
        answer: `[B, Hc, Wc]` (or `[Hc, Wc]`) bool, the answer's cells. An empty answer gives 0 everywhere.

    Example:
        >>> ans = torch.zeros(4, 4, dtype=torch.bool); ans[0, :2] = True
        >>> {s: v.tolist() for s, v in patch_coverage(torch.tensor([[0, 0, 1], [2, 0, 2]]), ans).items()}
        {0: [0.5], 1: [0.5], 2: [0.0]}
    """
    boxes, answer = (boxes[None], answer[None]) if boxes.ndim == 2 else (boxes, answer)
    if boxes.ndim != 3 or answer.ndim != 3 or answer.dtype != torch.bool or len(boxes) != len(answer):
        raise ValueError(f"need boxes [B, K, 3] and a bool answer [B, Hc, Wc], got {tuple(boxes.shape)} and "
                         f"{answer.dtype} {tuple(answer.shape)}")
    size = Patches(boxes, boxes[..., 0].float()).mask(*answer.shape[1:])
    total = answer.flatten(1).sum(1).clamp_min(1)
    sizes = [0] + sorted({int(s) for s in boxes[..., 2].unique().tolist() if s > 0})
    return {s: ((size == s) & answer).flatten(1).sum(1) / total for s in sizes}


# ----------------------------------------------------------------------------- registry
@PATCHERS.register("saliency")
def _saliency(relevance: Tensor, k: int, valid: Tensor | None = None, pixels: Tensor | None = None,
              size_prior: float = SIZE_PRIOR) -> Patches:
    """`saliency_patches` on any saliency map (the relevance, `edge_density`): exactly K tokens of sizes 1, 2, 4."""
    return saliency_patches(relevance, k, valid, size_prior=size_prior)


@PATCHERS.register("quadtree")
def _quadtree(relevance: Tensor, k: int, valid: Tensor | None = None, pixels: Tensor | None = None) -> Patches:
    """`quadtree_patches` refined by summed relevance (query-aware): at most K tokens.

    The largest leaf grows (8, 16, 32 cells) until the starting tiling fits the budget: a small
    budget on a large page has to begin with coarser leaves.
    """
    for max_size in (8, 16, 32):
        try:
            return quadtree_patches(relevance, k, valid, criterion="relevance", max_size=max_size)
        except BudgetTooSmallError:
            continue
    return quadtree_patches(relevance, k, valid, criterion="relevance", max_size=64)
