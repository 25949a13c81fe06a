"""VLM input processing: visual tokens, prompt ids from the chat template, prefix + visual + suffix assembly.

Shapes: ``B`` prompts, ``L`` padded prompt length, ``N`` visual tokens of one image, ``D`` LLM
width, ``R`` rotary rows (3 for M-RoPE (t, h, w); 1 for a plain 1-D RoPE LLM).

An adapter turns images + chosen cells into :class:`VisualTokens` (LLM-space embeddings with their
positions); :func:`assemble` splices them into tokenised prompts and lays out every position, so
the same prefill and decode code drives every model family. The cell and box checks here are the
ones every adapter applies to its input.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

MODES = ("sparse", "slice", "weighted")
LAYOUTS = ("scaled", "temporal")


@dataclass
class VisualTokens:
    """One image's visual tokens for the LLM: gestalt first, then saccades in relevance order."""

    embeds: Tensor  # [N, D] in the LLM's embedding space
    positions: Tensor  # [R, N] float rotary positions, relative to where the image starts
    n_gestalt: int  # the first n_gestalt tokens are the gestalt
    deepstack: list[Tensor] = field(default_factory=list)  # per injected LLM layer [N, D] (Qwen3-VL)
    vision_segments: tuple[int, ...] = ()  # patches per attention segment the tower encoded (FLOP estimate)

    @property
    def extent(self) -> int:
        """Positions the image occupies: the text after it continues at start + extent.

        Qwen-VL continues at ``start + max(h, w)`` of the grid, i.e. one past the largest position,
        so any layout (fractional or two-slice) keeps text strictly after every visual position.
        """
        return int(torch.floor(self.positions.max()).item()) + 1 if self.embeds.shape[0] else 0

    def __len__(self) -> int:
        return self.embeds.shape[0]


@dataclass
class Prefill:
    """A padded batch of prompts, ready for the LLM: embeddings, mask and every position."""

    inputs_embeds: Tensor  # [B, L, D], left-padded
    attention_mask: Tensor  # [B, L] long, 0 on padding
    position_ids: Tensor  # [R, B, L] float
    next_position: Tensor  # [B] float, the position of the first generated token
    visual_mask: Tensor  # [B, L] bool, True on visual tokens
    deepstack: list[Tensor]  # per injected layer [sum of N over the batch, D], in visual_mask order
    token_ids: Tensor | None = None  # [B, L] long text ids, -1 on visual tokens and padding (what generate reads back)


def box_centres(boxes: Tensor) -> Tensor:
    """Centres [K, 2] float (y, x), in cells, of (y, x, size) squares [K, 3]: where a shrunk square's token sits.

    >>> box_centres(torch.tensor([[2, 3, 1], [0, 0, 2]])).tolist()
    [[2.0, 3.0], [0.5, 0.5]]
    """
    return boxes[:, :2].float() + (boxes[:, 2:].float() - 1) / 2


def check_boxes(boxes: Any, grid: tuple[int, int], device: Any = None) -> Tensor:
    """Validated [K, 3] long (y, x, size) squares inside ``grid``, K >= 1."""
    boxes = torch.as_tensor(boxes, device=device)
    if boxes.ndim != 2 or boxes.shape[1] != 3 or len(boxes) == 0:
        raise ValueError(f"boxes must be a non-empty [K, 3] (y, x, size) tensor per image, "
                         f"got shape {tuple(boxes.shape)}")
    if boxes.is_floating_point() and not torch.equal(boxes, boxes.round()):
        raise ValueError("boxes must hold whole cells (y, x, size)")
    boxes = boxes.long()
    y, x, size = boxes.unbind(1)
    if (size < 1).any():
        raise ValueError("box sizes must be >= 1; size 0 marks padding in Patches.boxes: send only the "
                         "first counts[b] rows of image b")
    out = (y < 0) | (x < 0) | (y + size > grid[0]) | (x + size > grid[1])
    if out.any():
        bad = boxes[out][0].tolist()
        raise ValueError(f"boxes must be squares inside the {grid[0]}x{grid[1]} cell grid; (y, x, size) = "
                         f"{tuple(bad)} leaves it")
    return boxes



def check_options(mode: str | None = None, layout: str | None = None) -> None:
    """Raises unless ``mode`` is one of ``MODES`` and ``layout`` one of ``LAYOUTS`` (None: not checked)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


def image_grid(image: Tensor, cell: int) -> tuple[int, int]:
    """(Hc, Wc) cells of an image ``[3, H, W]`` whose sides are multiples of ``cell``, or a ValueError.

    >>> image_grid(torch.zeros(3, 28, 42), 14)
    (2, 3)
    """
    if image.ndim != 3 or image.shape[1] % cell or image.shape[2] % cell:
        raise ValueError(f"images must be [3, H, W] with sides multiples of the {cell} px cell, "
                         f"got {tuple(image.shape)}")
    return image.shape[1] // cell, image.shape[2] // cell


def check_cells(cells: Tensor | None, grid: tuple[int, int], device: Any = None, *,
                allow_empty: bool = False) -> Tensor:
    """Validated ``[K, 2]`` long (y, x) cells: distinct, inside ``grid``; K >= 1 unless ``allow_empty``
    (then None means none).

    >>> check_cells(torch.tensor([[1, 2]]), (2, 3)).tolist(), check_cells(None, (2, 3), allow_empty=True).shape
    ([[1, 2]], torch.Size([0, 2]))
    """
    if cells is None and allow_empty:
        return torch.zeros(0, 2, dtype=torch.long, device=device)
    if cells is None or cells.ndim != 2 or cells.shape[1] != 2 or (len(cells) == 0 and not allow_empty):
        shape = None if cells is None else tuple(cells.shape)
        raise ValueError(f"cells must be a {'' if allow_empty else 'non-empty '}[K, 2] (y, x) tensor per image, "
                         f"got {shape}")
    cells = cells.long().to(device)
    if ((cells < 0) | (cells >= torch.tensor(grid, device=cells.device))).any():
        raise ValueError(f"cells out of bounds for a {grid[0]}x{grid[1]} cell grid")
    flat = cells[:, 0] * grid[1] + cells[:, 1]
    if len(torch.unique(flat)) != len(flat):
        raise ValueError("cells must be distinct")
    return cells


def mode_cells(mode: str, cells: Tensor | None, weights: Tensor | None, grid: tuple[int, int], device: Any = None,
               *, allow_empty: bool = False) -> Tensor:
    """The cells an ``encode`` mode sends for one image: every cell under ``weighted`` (whose ``[Hc, Wc]``
    weight map is checked), else the chosen ``cells``, validated (:func:`check_cells`)."""
    if mode == "weighted":
        if weights is None or tuple(weights.shape) != tuple(grid):
            raise ValueError(f"weighted mode needs a [{grid[0]}, {grid[1]}] weight map per image")
        return all_cells(*grid, device)
    return check_cells(cells, grid, device, allow_empty=allow_empty)


def left_pad(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token id rows left-padded to one length: ``(input_ids [B, L], attention_mask [B, L])``, the layout
    :func:`assemble` gives, so a model's own forward on them is comparable token for token.

    >>> ids, mask = left_pad([[5, 6, 7], [8]], 0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    length = max(map(len, ids))
    input_ids = torch.tensor([[pad_id] * (length - len(i)) + list(i) for i in ids])
    mask = torch.tensor([[0] * (length - len(i)) + [1] * len(i) for i in ids])
    return input_ids, mask


def per_image(n: int, **given: Sequence | None) -> list[list]:
    """Each per-image argument as a list of ``n`` (None -> n Nones), or an error naming them all.

    >>> per_image(2, cells=[1, 2], gestalt=None)
    [[1, 2], [None, None]]
    """
    lists = [[None] * n if v is None else list(v) for v in given.values()]
    if any(len(v) != n for v in lists):
        names = list(given)
        listed = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
        raise ValueError(f"need {listed} for each of the {n} images")
    return lists


def chat_ids(tokenizer: Any, processor: Any, question: str, image_token_id: int, lead: Sequence[int] = ()) -> list[int]:
    """Token ids of a one-image user turn and the generation prompt, from the chat template.

    Without a template: ``lead`` (the family's image block, holding ``image_token_id``), then the question.
    """
    if tokenizer is None:
        raise ValueError("this adapter has no tokenizer; pass tokenizer= or processor=")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    source = processor if getattr(processor, "chat_template", None) else tokenizer
    if getattr(source, "chat_template", None):
        text = source.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(lead or [image_token_id]) + tokenizer(question, add_special_tokens=False)["input_ids"]


def split_at_image(ids: Sequence[int], image_token_id: int) -> tuple[list[int], list[int]]:
    """(ids before, ids after) the single image placeholder.

    >>> split_at_image([1, 2, 9, 3], 9)
    ([1, 2], [3])
    """
    where = [i for i, t in enumerate(ids) if t == image_token_id]
    if len(where) != 1:
        raise ValueError(f"the chat template must yield exactly one image placeholder, found {len(where)}")
    return list(ids[:where[0]]), list(ids[where[0] + 1:])


def left_pad_rows(rows: Sequence[tuple[Tensor, Tensor, Tensor]], rope_rows: int
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-prompt (embeds ``[n, D]``, positions ``[R, n]``, visual mask ``[n]``) left-padded into one batch.

    Returns ``(embeds [B, L, D], attention mask [B, L] long, positions [R, B, L], visual mask [B, L])``;
    padding sits on the left so every row's next token is at column L, as cached generation expects.
    """
    length = max(len(r[0]) for r in rows)
    b, d, dev = len(rows), rows[0][0].shape[1], rows[0][0].device
    embeds = rows[0][0].new_zeros(b, length, d)
    mask = torch.zeros(b, length, dtype=torch.long, device=dev)
    pos = torch.zeros(rope_rows, b, length, device=dev)
    vmask = torch.zeros(b, length, dtype=torch.bool, device=dev)
    for i, (emb, p, v) in enumerate(rows):
        n = len(emb)
        embeds[i, length - n:], mask[i, length - n:], pos[:, i, length - n:], vmask[i, length - n:] = emb, 1, p, v
    return embeds, mask, pos, vmask


def left_pad_ids(rows: Sequence[Sequence[int]], length: int, device: Any = None) -> Tensor:
    """Token id rows left-padded with -1 to ``length``: [B, length] long, as :func:`left_pad_rows` lays out embeddings.

    >>> left_pad_ids([[5, -1, 7], [9]], 3).tolist()
    [[5, -1, 7], [-1, -1, 9]]
    """
    out = torch.full((len(rows), length), -1, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        if len(r):
            out[i, length - len(r):] = torch.as_tensor(list(r), dtype=torch.long)
    return out


def assemble(embed_tokens: Callable[[Tensor], Tensor], prefixes: Sequence[Sequence[int]],
             visuals: Sequence[VisualTokens], suffixes: Sequence[Sequence[int]], rope_rows: int) -> Prefill:
    """Splice each image's visual tokens between its prompt's prefix and suffix tokens; left-pad.

    Text before the image counts 0, 1, ...; the image sits at ``start + positions``; text after
    it continues at ``start + extent`` -- the Qwen-VL rule, which the native path follows too.
    """
    if not (len(prefixes) == len(visuals) == len(suffixes)) or not visuals:
        raise ValueError(f"need one prefix, visual set and suffix per prompt, got {len(prefixes)}, "
                         f"{len(visuals)}, {len(suffixes)}")
    rows = []
    for pre, vis, suf in zip(prefixes, visuals, suffixes):
        if vis.positions.shape != (rope_rows, len(vis)):
            raise ValueError(f"visual positions must be [{rope_rows}, {len(vis)}], got {tuple(vis.positions.shape)}")
        dev = vis.embeds.device
        pre_t = torch.as_tensor(list(pre), dtype=torch.long, device=dev)
        suf_t = torch.as_tensor(list(suf), dtype=torch.long, device=dev)
        text_pre, text_suf = embed_tokens(pre_t[None])[0], embed_tokens(suf_t[None])[0]
        emb = torch.cat([text_pre, vis.embeds.to(text_pre.dtype), text_suf])  # [n, D]
        start, after = len(pre), len(pre) + vis.extent
        pos = torch.cat([torch.arange(len(pre), device=dev, dtype=torch.float32).expand(rope_rows, -1),
                         vis.positions.float().to(dev) + start,
                         (torch.arange(len(suf), device=dev, dtype=torch.float32) + after).expand(rope_rows, -1)],
                        dim=1)  # [R, n]
        is_vis = torch.zeros(emb.shape[0], dtype=torch.bool, device=dev)
        is_vis[len(pre):len(pre) + len(vis)] = True
        rows.append((emb, pos, is_vis, after + len(suf)))
    embeds, mask, pos, vmask = left_pad_rows([r[:3] for r in rows], rope_rows)
    dev = embeds.device
    layers = len(visuals[0].deepstack)
    if any(len(v.deepstack) != layers for v in visuals):
        raise ValueError("every image must carry the same number of deepstack layers")
    deepstack = [torch.cat([v.deepstack[j] for v in visuals]) for j in range(layers)]
    nxt = torch.tensor([float(r[3]) for r in rows], device=dev)
    ids = left_pad_ids([[*pre, *[-1] * len(vis), *suf] for pre, vis, suf in zip(prefixes, visuals, suffixes)],
                       mask.shape[1], dev)
    return Prefill(embeds, mask, pos, nxt, vmask, deepstack, ids)


# CLIP's pixel normalisation, which the Qwen-VL and LLaVA towers share
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def all_cells(hc: int, wc: int, device: Any = None) -> Tensor:
    """Every cell of a grid in raster order: ``[hc * wc, 2] (y, x)``.

    >>> all_cells(2, 3).tolist()
    [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    ys, xs = torch.meshgrid(torch.arange(hc, device=device), torch.arange(wc, device=device), indexing="ij")
    return torch.stack([ys.flatten(), xs.flatten()], -1)


def table_taps(coords: Tensor, size: Tensor, side: int) -> tuple[Tensor, Tensor]:
    """Bilinear (align_corners) taps into a side x side position table at float patch coordinates.

    Qwen3-VL resamples its learned table to each image's patch grid ``size`` (rows, cols); this is
    the same resampling read at any point, so a shrunk patch gets the embedding of its centre.
    Returns indices and weights [n, 4] for ``interp_indices`` / ``interp_weights``.
    """
    src = coords.float() * (side - 1) / (size.to(coords.device).float() - 1).clamp_min(1)  # [n, 2]
    lo = src.floor().clamp(0, side - 1)
    hi = (lo + 1).clamp(max=side - 1)
    frac = (src - lo).clamp(0, 1)
    taps_y, taps_x = torch.stack([lo[:, 0], hi[:, 0]], 1), torch.stack([lo[:, 1], hi[:, 1]], 1)  # [n, 2]
    wy = torch.stack([1 - frac[:, 0], frac[:, 0]], 1)
    wx = torch.stack([1 - frac[:, 1], frac[:, 1]], 1)
    idx = (taps_y[:, :, None] * side + taps_x[:, None, :]).reshape(-1, 4).long()
    return idx, (wy[:, :, None] * wx[:, None, :]).reshape(-1, 4)


def check_prompt(template: str) -> str:
    """A prompt template with ``{question}`` as its one field, else a one-line error (literal braces doubled).

    >>> check_prompt("Q: {question} (as JSON: {{\\"answer\\": ...}})")
    'Q: {question} (as JSON: {{"answer": ...}})'
    """
    import string

    if not isinstance(template, str):
        raise TypeError(f"the prompt must be a str template, got {type(template).__name__}")
    double = "write a literal brace as {{ or }}"
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError as err:
        raise ValueError(f"the prompt {template!r} is not a template ({err}); {double}") from None
    for name, spec, conv in fields:
        if name != "question" or spec or conv:
            shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"the prompt may hold only {{question}}, got {shown} in {template!r}; {double}")
    if not fields:
        raise ValueError(f"the prompt must hold {{question}}, got {template!r}")
    return template
