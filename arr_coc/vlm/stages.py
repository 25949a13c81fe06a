"""The VLM path's reading stages: encode (Plans -> visual tokens), prefill, decode.

The allocation stage before them is :mod:`arr_coc.vlm.allocation`; :func:`arr_coc.vlm.ask` runs the four in a
row, the VLM evaluation and ``benchmarks/bench_vlm.py`` call them too, timing or swapping one stage at a time.

* :func:`encode` -- cells through ``adapter.encode``, squares through ``encode_patches``, full
  through every cell, native through the model's own processor (``encode_processed``); a gestalt
  the first look encoded is reused.
* :func:`prefill` -- each prompt's text runs around its pages' visual tokens (one page or several: the
  pages of a context), or their continuation of the first look's cache.
* :func:`decode` -- the answer through the model's own ``generate`` (greedy by default, any
  ``GenerationConfig``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from torch import Tensor

from arr_coc.config import MAX_NEW_TOKENS
from arr_coc.engine.plan import Plan
from arr_coc.threads import check_model
from arr_coc.vlm.first_look import FirstLook, second_pass_prefill
from arr_coc.vlm.generation import generate
from arr_coc.vlm.processing import Prefill, VisualTokens, all_cells, assemble_context, left_pad_ids
from arr_coc.vlm.protocol import FIRST_LOOK, PROCESSOR, VLMAdapter


def encode(adapter: VLMAdapter, plans: Sequence[Plan], images: Sequence[Tensor], *, layout: str = "scaled",
           weights: Sequence[Tensor | None] | None = None, encoded: Sequence[VisualTokens] | None = None,
           sources: Sequence[Any] | None = None) -> list[VisualTokens]:
    """The visual tokens of each image's plan, in plan order; plans of one kind and encoding share a tower call.

    Args:
        plans, images: per image its Plan and its pixels [3, H, W] in [0, 1] (sides multiples of the cell).
        layout: saccade positions relative to the gestalt (``adapter.layouts``).
        weights: per image [Hc, Wc] for a ``weighted`` full plan.
        encoded: per image the gestalt tokens the first look encoded, reused (capability ``first_look``).
        sources: per image what the model's own processor resizes for a ``native`` plan (a PIL image;
            default: the pixels as a PIL image).
    """
    adapter.check_layout(layout)
    check_model(adapter, "encode")
    if not (len(plans) == len(images)) or (weights is not None and len(weights) != len(plans)) \
            or (encoded is not None and len(encoded) != len(plans)):
        raise ValueError(f"need one plan, image (and weight map, encoded gestalt) per image, got {len(plans)} plans "
                         f"and {len(images)} images")
    if encoded is not None:
        adapter.require(FIRST_LOOK, "reusing the first look's gestalt")
    groups: dict[tuple[str, str], list[int]] = {}
    for b, p in enumerate(plans):
        groups.setdefault((p.kind, p.encoding), []).append(b)
    out: list[VisualTokens | None] = [None] * len(plans)
    for (kind, encoding), idx in groups.items():
        imgs, ps = [images[b] for b in idx], [plans[b] for b in idx]
        reuse = {} if encoded is None else {"encoded": [encoded[b] for b in idx]}
        if kind == "cells":
            vis = adapter.encode(imgs, [p.cells for p in ps], mode=encoding, gestalt=[p.gestalt for p in ps],
                                 layout=layout, **reuse)
        elif kind == "squares":
            vis = adapter.encode_patches(imgs, [p.squares for p in ps], gestalt=[p.gestalt for p in ps],
                                         layout=layout, **reuse)
        elif kind == "full" and encoding == "weighted":
            if weights is None:
                raise ValueError("a weighted plan needs weights= (a [Hc, Wc] map per image)")
            vis = adapter.encode(imgs, [p.cells for p in ps], mode="weighted", gestalt=[None] * len(ps),
                                 layout=layout, weights=[weights[b] for b in idx])
        elif kind == "full":
            vis = adapter.encode(imgs, [all_cells(*p.grid) for p in ps], mode="slice")
        else:  # native: the model's own processor at the plan's token cap, one call per image
            adapter.require(PROCESSOR, "a native plan")
            vis = [adapter.encode_processed([_source(sources, b, images[b])], plans[b].native)[0] for b in idx]
        for b, v in zip(idx, vis):
            out[b] = v
    return out  # type: ignore[return-value]  (every index is filled by its group)


def _source(sources: Sequence[Any] | None, b: int, image: Tensor) -> Any:
    """What the model's processor reads for image b: the given source, else the pixels as a PIL image."""
    if sources is not None:
        return sources[b]
    from PIL import Image

    return Image.fromarray((image.float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy())


@dataclass
class Prompt:
    """A batch of prompts ready to decode: the prefill inputs, and the first look's cache they continue."""

    prefill: Prefill
    # per prompt its runs of text ids around its pages: before the first page, between pages, after the last
    # (one page: (before, after))
    prompts: list[list[list[int]]]
    first_look: FirstLook | None = None

    def first_look_work(self, b: int, visual: VisualTokens | Sequence[VisualTokens]) -> tuple[int, int]:
        """Prompt b's first-look work for the FLOP estimate: (question tokens read again, cached tokens under them).
        A first look reads one page (``visual``: its tokens, or the list of that one page's)."""
        if self.first_look is None:
            return 0, 0
        pre, suf = self.prompts[b]
        vis = visual if isinstance(visual, VisualTokens) else visual[0]
        return len(suf), len(pre) + vis.n_gestalt


def prefill(adapter: VLMAdapter, visuals: Sequence[VisualTokens | Sequence[VisualTokens]],
            prompts: Sequence[Sequence[Sequence[int]]], *, first_look: FirstLook | None = None) -> Prompt:
    """The batch's prompts: prompt b holds its pages' visual tokens ``visuals[b]`` (one page: its
    VisualTokens, or a list of one) between its runs of ids ``prompts[b]`` (one page: (before, after);
    n pages: the n + 1 runs of :meth:`VLMAdapter.prompt_segments`), each page at its own positions as the
    model's multi-image path places them, left-padded (:func:`arr_coc.vlm.processing.assemble_context`).
    Prompts of different page counts batch together.

    With ``first_look`` (one page per prompt), the saccades and the question that continue the first look's
    cache (whose prompts they are).
    """
    check_model(adapter, "prefill")
    pages = [[v] if isinstance(v, VisualTokens) else list(v) for v in visuals]
    if first_look is not None:
        if any(len(p) != 1 for p in pages):
            raise ValueError("a first look's cache holds one image per prompt; give one page per prompt")
        return Prompt(second_pass_prefill(adapter, first_look, [p[0] for p in pages]),
                      [[list(p), list(s)] for p, s in zip(first_look.prefixes, first_look.suffixes)], first_look)
    texts = [[list(run) for run in runs] for runs in prompts]
    return Prompt(assemble_context(adapter.embed_tokens, texts, pages, adapter.rope_rows), texts)


def decode(adapter: VLMAdapter, prompt: Prompt, *, max_new_tokens: int = MAX_NEW_TOKENS,
           generation_config: Any = None, streamer: Any = None, seed: int | None = None, logits: bool = True,
           timings: dict[str, float] | None = None) -> tuple[Tensor, Tensor | None]:
    """The answers (tokens [B, T]; logits [B, T, V] without beam search) from the model's own ``generate``
    (:func:`arr_coc.vlm.generation.generate`): greedy by default, or any ``transformers.GenerationConfig``.

    ``max_new_tokens`` is the limit where ``generation_config`` sets none; ``streamer`` a transformers
    streamer (one prompt); ``seed`` seeds sampling without touching torch's global generator;
    ``logits=False`` keeps no logits (None in their place).
    ``timings`` collects ``prefill`` (the prompt's forward) and ``decode`` milliseconds. A first
    look's cache is consumed: it answers once.
    """
    check_model(adapter, "decode")
    g: dict[str, float] = {}
    look, past = prompt.first_look, {}
    if look is not None:
        cached = [[*pre, *[-1] * len(vis)] for pre, vis in zip(look.prefixes, look.gestalt)]
        past = dict(cache=look.cache, past_mask=look.attention_mask,
                    past_ids=left_pad_ids(cached, look.attention_mask.shape[1], look.attention_mask.device))
    out = generate(adapter, prompt.prefill, generation_config=generation_config, max_new_tokens=max_new_tokens,
                   streamer=streamer, seed=seed, logits=logits, timings=g if timings is not None else None, **past)
    if timings is not None:
        timings["prefill"] = timings.get("prefill", 0.0) + g["prefill_ms"]
        timings["decode"] = timings.get("decode", 0.0) + g["decode_ms"]
    return out
