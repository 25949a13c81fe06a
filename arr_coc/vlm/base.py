"""The VLM adapter protocol, prompt assembly with explicit positions, and cached greedy decoding.

Shapes: ``B`` prompts, ``L`` padded prompt length, ``N`` visual tokens of one image, ``D`` LLM
width, ``R`` rotary rows (3 for M-RoPE (t, h, w); 1 for a plain 1-D RoPE LLM).

An adapter turns images + chosen cells into :class:`VisualTokens` (LLM-space embeddings with their
positions); :func:`assemble` splices them into tokenised prompts and lays out every position, so
the same prefill and decode code drives every model family.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch
from torch import Tensor

from arr_coc.registry import Registry

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


class VLMAdapter(Protocol):
    """What arr-coc needs from a frozen VLM family."""

    name: str
    cell: int  # px per LLM token side (one merged token); the canvas is built on this cell
    rope_rows: int  # 3 for M-RoPE, 1 for 1-D RoPE
    text_config: Any  # the LLM's config (decode cache, eos)
    tokenizer: Any

    def encode(self, images: Sequence[Tensor], cells: Sequence[Tensor | None], *, mode: str = "sparse",
               gestalt: Sequence[tuple[int, int] | None] | None = None, layout: str = "scaled",
               weights: Sequence[Tensor | None] | None = None) -> list[VisualTokens]:
        """Visual tokens per image ([3, H, W] in [0, 1], sides multiples of ``cell``) for its cells [K, 2]."""

    def encode_patches(self, images: Sequence[Tensor], boxes: Sequence[Tensor], *,
                       gestalt: Sequence[tuple[int, int] | None] | None = None, layout: str = "scaled"
                       ) -> list[VisualTokens]:
        """Variable-size patches: each (y, x, size) square [K, 3] shrunk to one token at its centre."""

    def encode_native(self, images: Sequence[Tensor]) -> list[VisualTokens]:
        """The model's own full-resolution encoding (the upper bound, and the exactness reference)."""

    def prompt_ids(self, question: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the image for one question (chat template applied)."""

    def language_model(self, x: dict) -> Tensor:
        """Final hidden states [B, L, D] for ``x``: inputs_embeds, attention_mask, position_ids [R, B, L],
        optional past_key_values, visual_mask and deepstack (prefill only)."""

    def logits(self, hidden: Tensor) -> Tensor:
        """LM head: [B, L, D] -> [B, L, V]."""

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """Token embeddings [B, L] -> [B, L, D]."""

    def native_inputs(self, images: Sequence[Tensor], questions: Sequence[str]) -> dict[str, Tensor]:
        """Inputs for the model's own forward on the same images: the exactness reference."""


ADAPTERS: Registry = Registry("VLM adapter")


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


def assemble(embed_tokens, prefixes: Sequence[Sequence[int]], visuals: Sequence[VisualTokens],
             suffixes: Sequence[Sequence[int]], rope_rows: int) -> Prefill:
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
    length = max(r[0].shape[0] for r in rows)
    b, d, dev = len(rows), rows[0][0].shape[1], rows[0][0].device
    embeds = rows[0][0].new_zeros(b, length, d)
    mask = torch.zeros(b, length, dtype=torch.long, device=dev)
    pos = torch.zeros(rope_rows, b, length, device=dev)
    vmask = torch.zeros(b, length, dtype=torch.bool, device=dev)
    for i, (emb, p, v, _) in enumerate(rows):
        n = emb.shape[0]
        embeds[i, length - n:], mask[i, length - n:], pos[:, i, length - n:], vmask[i, length - n:] = emb, 1, p, v
    layers = len(visuals[0].deepstack)
    if any(len(v.deepstack) != layers for v in visuals):
        raise ValueError("every image must carry the same number of deepstack layers")
    deepstack = [torch.cat([v.deepstack[j] for v in visuals]) for j in range(layers)]
    nxt = torch.tensor([float(r[3]) for r in rows], device=dev)
    return Prefill(embeds, mask, pos, nxt, vmask, deepstack)


def synchronize(device: Any) -> None:
    """Wait for the device's queued work, so a wall-clock reading covers it (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(adapter: VLMAdapter, prefill: Prefill, *, max_new_tokens: int = 32,
             eos_token_id: int | Sequence[int] | None = None, cache: Any = None,
             past_mask: Tensor | None = None, timings: dict[str, float] | None = None) -> tuple[Tensor, Tensor]:
    """Greedy decoding with a KV cache from a prefill with explicit positions.

    ``cache`` (a transformers ``DynamicCache``) may already hold the start of every prompt, with
    ``past_mask`` [B, L0] its padding mask: the prefill then continues those prompts.

    Returns:
        tokens [B, T] (T <= max_new_tokens; finished rows repeat ``eos``) and the logits [B, T, V] that
        chose them. ``timings``, when given, receives ``prefill_ms`` and ``decode_ms`` of the batch.
    """
    from transformers import DynamicCache

    eos = torch.tensor([] if eos_token_id is None else
                       ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)),
                       device=prefill.attention_mask.device)
    device = prefill.inputs_embeds.device
    start = time.perf_counter()
    mask = prefill.attention_mask
    if cache is None:
        cache = DynamicCache(config=adapter.text_config)
    elif past_mask is None or past_mask.shape[1] != cache.get_seq_length():
        raise ValueError("continuing a cache needs past_mask [B, cached length]")
    else:
        mask = torch.cat([past_mask.to(mask), mask], 1)
    hidden = adapter.language_model(dict(inputs_embeds=prefill.inputs_embeds, attention_mask=mask,
                                         position_ids=prefill.position_ids, past_key_values=cache,
                                         visual_mask=prefill.visual_mask, deepstack=prefill.deepstack))
    logits = adapter.logits(hidden[:, -1:])  # [B, 1, V]
    if timings is not None:
        synchronize(device)
        timings["prefill_ms"] = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
    b = mask.shape[0]
    done = torch.zeros(b, dtype=torch.bool, device=mask.device)
    tokens, scores = [], []
    for step in range(max_new_tokens):
        nxt = logits[:, -1].argmax(-1)  # [B]
        if eos.numel():
            nxt = torch.where(done, eos[0].to(nxt), nxt)
        tokens.append(nxt)
        scores.append(logits[:, -1])
        done |= torch.isin(nxt, eos.to(nxt))
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        pos = (prefill.next_position + step)[None, :, None].expand(adapter.rope_rows, b, 1)  # [R, B, 1]
        hidden = adapter.language_model(dict(inputs_embeds=adapter.embed_tokens(nxt[:, None]), attention_mask=mask,
                                             position_ids=pos, past_key_values=cache))
        logits = adapter.logits(hidden)
    out = torch.stack(tokens, 1), torch.stack(scores, 1)
    if timings is not None:
        synchronize(device)
        timings["decode_ms"] = (time.perf_counter() - start) * 1e3
    return out


def flops_estimate(n_params_llm: int, llm_layers: int, llm_width: int, prompt_tokens: int,
                   n_params_vit: int = 0, vit_layers: int = 0, vit_width: int = 0,
                   vit_segments: Sequence[int] = ()) -> dict[str, float]:
    """Prefill FLOPs: 2 per weight per token, plus attention (QK^T and AV) over each sequence.

    The LLM's causal attention is counted at half the square; the vision tower attends fully within
    each segment (window attention is counted as full: an upper bound).

    >>> f = flops_estimate(1_000, 2, 8, 10)
    >>> f["llm"] == 2 * 1_000 * 10 + 2 * 2 * 8 * 10 * 10
    True
    """
    llm = 2.0 * n_params_llm * prompt_tokens + 2.0 * llm_layers * llm_width * prompt_tokens ** 2
    patches = sum(vit_segments)
    vit = 2.0 * n_params_vit * patches + 4.0 * vit_layers * vit_width * sum(s * s for s in vit_segments)
    return {"llm": llm, "vision": vit, "total": llm + vit}


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
