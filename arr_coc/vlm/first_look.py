"""The VLM's first look: where the question attends in the gestalt, and a second pass that reuses it.

Shapes: ``B`` prompts, ``L1`` the padded length of chat prefix + gestalt, ``Q`` the padded length of
the text after the image (the question's tokens), ``G`` gestalt tokens of one image (gh * gw),
``H`` attention heads, ``Hc, Wc`` token cells of an image.

1. :func:`first_look` prefills chat prefix + gestalt into a KV cache, then runs the text after the
   image (the question) on top of it, up to the last decoder layer it reads (:class:`StopAfter`). From the input of chosen decoder layers it recomputes how
   strongly each question token (the last :data:`LOOK_TOKENS` of them) attends to each gestalt token
   (:func:`question_attention`), with
   the layer's own norm, query/key projections and the model's own rotary tables: no
   ``output_attentions``, so the model keeps its own attention kernel (tested under SDPA against eager
   weights; no FlashAttention path is tested). The question is then cut from the cache again.
2. :func:`second_pass_prefill` lays out the saccades and the question that continue that cache
   (:func:`arr_coc.vlm.stages.prefill`, then ``decode``). The prompt is the sequence a single pass
   builds (prefix, gestalt, saccades, question; ``processing.assemble``), so the answer is the single
   pass's; the extra LLM work is the question prefilled twice.

Everything stays on the model's device: the maps are computed where the LLM runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.vlm.generation import model_positions, timed
from arr_coc.vlm.processing import Prefill, VisualTokens, assemble, left_pad_ids, left_pad_rows
from arr_coc.vlm.protocol import VLMAdapter

# The first look reads attention from the last LOOK_TOKENS tokens after the image (the end of the question and
# the generation prompt, where the answer will be read from), so its read costs [layers, heads, 64, context]
# floats however long the question; chat-templated benchmark questions are shorter and are read whole.
LOOK_TOKENS = 64


@dataclass
class FirstLook:
    """The question's attention to each image's gestalt, and the cache to answer from."""

    cache: Any  # transformers DynamicCache holding chat prefix + gestalt of every prompt, [B, L1]
    attention_mask: Tensor  # [B, L1] long, 0 on left padding
    gestalt: list[VisualTokens]  # per image its gestalt tokens, as prefilled
    grids: list[tuple[int, int]]  # per image the gestalt grid (rows, cols)
    prefixes: list[list[int]]  # token ids before the image
    suffixes: list[list[int]]  # token ids after the image (the question and the generation prompt)
    attention: list[Tensor]  # per image [layers, H, Q_b, G], Q_b <= LOOK_TOKENS: question-token attention to the gestalt
    layers: tuple[int, ...]  # the decoder layers read

    def maps(self) -> list[Tensor]:
        """Per image the gestalt-grid map [gh, gw]: attention averaged over layers, heads and question tokens."""
        return [a.mean((0, 1, 2)).reshape(g) for a, g in zip(self.attention, self.grids)]

    def cell_maps(self, grids: Sequence[tuple[int, int]]) -> list[Tensor]:
        """Per image the map spread over its token cells ``grids[b]`` = (Hc, Wc), scaled to max 1.

        The gestalt is the image shrunk to (gh, gw) cells, so gestalt token (i, j) stands for the
        image region whose centre is at ((i + 0.5) Hc / gh - 0.5, ...) in cells: bilinear
        resampling with ``align_corners=False`` puts every token cell between the gestalt tokens
        around it, the same placement the ``scaled`` layout gives saccades in the LLM.
        """
        out = []
        for m, g in zip(self.maps(), grids):
            up = F.interpolate(m[None, None].float(), size=tuple(g), mode="bilinear", align_corners=False)[0, 0]
            out.append(up / up.max().clamp_min(1e-12))
        return out

    def relevance_map(self, grids: Sequence[tuple[int, int]], size: tuple[int, int]) -> Tensor:
        """The cell maps of :meth:`cell_maps` on a padded batch grid ``size`` (Hc, Wc): [B, Hc, Wc], 0 on padding."""
        maps = self.cell_maps(grids)
        out = maps[0].new_zeros(len(maps), *size)
        for b, (m, g) in enumerate(zip(maps, grids)):
            out[b, :g[0], :g[1]] = m
        return out


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The middle half of the decoder, where question-to-image attention is read by default.

    >>> default_layers(36), default_layers(2)
    ((9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26), (0, 1))
    """
    lo, hi = n_layers // 4, max(n_layers // 4 + 1, (3 * n_layers) // 4)
    return tuple(range(lo, hi)) if n_layers > 2 else tuple(range(n_layers))


def rotate_half(x: Tensor) -> Tensor:
    """RoPE's rotation of the two halves of the last dimension: (a, b) -> (-b, a)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def question_attention(adapter: VLMAdapter, layer: int, hidden: Tensor, position_ids: Tensor, attention_mask: Tensor,
                       n_queries: int) -> Tensor:
    """Attention probabilities of the last ``n_queries`` tokens over every token, in decoder layer ``layer``.

    Recomputed from that layer's input ``hidden`` [B, L, D] with its own submodules: the input
    norm, the query/key projections (and the per-head q/k norms where the family has them), the
    LLM's rotary embedding at ``position_ids`` [R, B, L], key heads repeated over their query group,
    the causal and padding mask of ``attention_mask`` [B, L], and a float32 softmax -- what eager
    attention returns with ``output_attentions=True``.

    Returns:
        [B, H, n_queries, L] float32; padded keys get exactly 0.
    """
    block = adapter.lm.layers[layer]
    attn = block.self_attn
    x = block.input_layernorm(hidden)
    b, length, _ = x.shape
    hd = attn.head_dim
    q = attn.q_proj(x[:, length - n_queries:]).view(b, n_queries, -1, hd)
    k = attn.k_proj(x).view(b, length, -1, hd)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3: RMSNorm per head before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, n, hd]
    cos, sin = adapter.lm.rotary_emb(x, model_positions(adapter, position_ids))  # [B, L, hd]
    cos, sin = cos[:, None], sin[:, None]
    q = q * cos[:, :, length - n_queries:] + rotate_half(q) * sin[:, :, length - n_queries:]
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q @ k.transpose(-1, -2)).float() * attn.scaling  # [B, H, n, L]
    rows = torch.arange(length - n_queries, length, device=x.device)[:, None]
    allowed = (torch.arange(length, device=x.device)[None] <= rows)[None, None] \
        & attention_mask.bool()[:, None, None, :]
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)


class _Stop(Exception):
    """Raised before the first decoder layer past the last one read: the question's forward ends there."""


class StopAfter:
    """A forward pre-hook on decoder layer ``last + 1`` that ends the forward there (nothing when ``last`` is the
    top layer): the first look's question pass needs no layer above the last one it reads, nor the final norm.

    The layers above ``last`` then hold no keys for the question; :func:`first_look` cuts the question from the
    layers that do.
    """

    def __init__(self, layers: Any, last: int) -> None:
        self.stopped = False
        self.handle = layers[last + 1].register_forward_pre_hook(self._stop) if last + 1 < len(layers) else None

    @staticmethod
    def _stop(module: Any, args: tuple) -> None:
        raise _Stop

    def __enter__(self) -> "StopAfter":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if self.handle is not None:
            self.handle.remove()
        self.stopped = kind is _Stop
        return self.stopped  # swallow only our own stop


class LayerInputs:
    """Forward pre-hooks that keep the input hidden states of chosen decoder layers, call by call."""

    def __init__(self, layers: Any, chosen: Sequence[int]) -> None:
        self.seen: dict[int, list[Tensor]] = {i: [] for i in chosen}
        self.handles = [layers[i].register_forward_pre_hook(self._keeper(i), with_kwargs=True) for i in chosen]

    def _keeper(self, i: int):
        def keep(module: Any, args: tuple, kwargs: dict) -> None:
            self.seen[i].append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])
        return keep

    def __enter__(self) -> "LayerInputs":
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()


def chunk(embed_tokens: Callable[[Tensor], Tensor], visuals: Sequence[Tensor], positions: Sequence[Tensor], texts: Sequence[Sequence[int]],
          text_starts: Sequence[float], rope_rows: int, deepstack: Sequence[Sequence[Tensor]] = ()
          ) -> Prefill:
    """Visual tokens then text per prompt, left-padded: one piece of a longer sequence.

    ``visuals[b]`` [n_b, D] sit at ``positions[b]`` [R, n_b] (absolute); the text ids ``texts[b]``
    continue at ``text_starts[b]``, ``+ 1``, ... Padding inside the sequence is masked like any
    padding, and positions are explicit, so a gap changes nothing for the tokens around it.
    ``next_position`` is the position after each prompt's text.
    """
    rows = []
    for vis, pos, ids, start in zip(visuals, positions, texts, text_starts):
        dev = vis.device
        ids_t = torch.as_tensor(list(ids), dtype=torch.long, device=dev)
        text = embed_tokens(ids_t[None])[0]
        emb = torch.cat([vis.to(text.dtype), text])
        p = torch.cat([pos.float().to(dev), (torch.arange(len(ids), device=dev, dtype=torch.float32) + start)
                       .expand(rope_rows, -1)], 1)
        is_vis = torch.zeros(len(emb), dtype=torch.bool, device=dev)
        is_vis[:len(vis)] = True
        rows.append((emb, p, is_vis, start + len(ids)))
    embeds, mask, pos, vmask = left_pad_rows([r[:3] for r in rows], rope_rows)
    dev = embeds.device
    layers = len(deepstack[0]) if deepstack else 0
    stacked = [torch.cat([ds[j] for ds in deepstack]) for j in range(layers)]
    nxt = torch.tensor([float(r[3]) for r in rows], device=dev)
    ids = left_pad_ids([[-1] * len(vis) + list(t) for vis, t in zip(visuals, texts)], mask.shape[1], dev)
    return Prefill(embeds, mask, pos, nxt, vmask, stacked, ids)


@torch.no_grad()
def first_look(adapter: VLMAdapter, gestalt: Sequence[VisualTokens], grids: Sequence[tuple[int, int]],
               questions: Sequence[str] | None = None, *, layers: Sequence[int] | None = None,
               prompts: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
               timings: dict[str, float] | None = None) -> FirstLook:
    """Prefill chat prefix + gestalt (kept) and the question (read, then dropped); read the question's attention.

    Args:
        adapter: a VLM adapter whose LLM has ``layers[i].input_layernorm``, ``.self_attn.{q,k}_proj``
            and ``rotary_emb`` (the Qwen-VL and Llama families).
        gestalt: per image its gestalt tokens only (``adapter.encode_gestalt``), positions relative to
            the image start.
        grids: per image the gestalt grid (rows, cols), rows * cols = len(gestalt[b]).
        questions: one per image (chat-templated by ``adapter.prompt_ids``), or None with ``prompts``.
        layers: decoder layers to read (default :func:`default_layers`).
        prompts: per image the token ids (before, after) the image, instead of ``questions``.
        timings: collects ``prefill/gestalt`` (chat prefix + gestalt, work a single pass does too) and
            ``allocation/first look`` (the question on top, and the attention read from it: the extra work).
    """
    from transformers import DynamicCache

    n_layers = len(adapter.lm.layers)
    layers = tuple(default_layers(n_layers) if layers is None else layers)
    if not layers or any(not 0 <= i < n_layers for i in layers):
        raise ValueError(f"layers must be decoder layers 0..{n_layers - 1}, got {list(layers)}")
    for vis, g in zip(gestalt, grids):
        if len(vis) != g[0] * g[1] or vis.n_gestalt != len(vis):
            raise ValueError(f"the first look takes gestalt tokens only, {g[0]}x{g[1]} = {g[0] * g[1]} per image; "
                             f"got {len(vis)} tokens ({vis.n_gestalt} gestalt)")
    if (questions is None) == (prompts is None):
        raise ValueError("pass either questions or prompts")
    prompts = [adapter.prompt_ids(q) for q in questions] if prompts is None else prompts
    if len(prompts) != len(gestalt) or len(grids) != len(gestalt):
        raise ValueError(f"need a question and a gestalt grid for each of the {len(gestalt)} images")
    prefixes, suffixes = [list(p[0]) for p in prompts], [list(p[1]) for p in prompts]
    # chat prefix + gestalt: assemble with no text after the image
    head = assemble(adapter.embed_tokens, prefixes, list(gestalt), [[] for _ in gestalt], adapter.rope_rows)
    starts = [float(len(p) + v.extent) for p, v in zip(prefixes, gestalt)]
    dev = head.inputs_embeds.device
    empty = [head.inputs_embeds.new_zeros(0, head.inputs_embeds.shape[-1]) for _ in gestalt]
    tail = chunk(adapter.embed_tokens, empty, [torch.zeros(adapter.rope_rows, 0, device=dev) for _ in gestalt],
                 suffixes, starts, adapter.rope_rows)
    cache = DynamicCache(config=adapter.text_config)
    mask = torch.cat([head.attention_mask, tail.attention_mask], 1)
    with LayerInputs(adapter.lm.layers, layers) as seen:
        with timed(timings, "prefill/gestalt", dev):
            adapter.language_model(dict(inputs_embeds=head.inputs_embeds, attention_mask=head.attention_mask,
                                        position_ids=head.position_ids, past_key_values=cache,
                                        visual_mask=head.visual_mask, deepstack=head.deepstack))
        kept = head.inputs_embeds.shape[1]
        with timed(timings, "allocation/first look", dev), StopAfter(adapter.lm.layers, max(layers)):
            adapter.language_model(dict(inputs_embeds=tail.inputs_embeds, attention_mask=mask,
                                        position_ids=tail.position_ids, past_key_values=cache))
    with timed(timings, "allocation/first look", dev):
        for layer in cache.layers:  # keep prefix + gestalt only (layers above the last read never saw the question)
            extra = layer.get_seq_length() - kept
            if extra > 0:
                layer.crop(-extra)
        positions = torch.cat([head.position_ids, tail.position_ids], 2)
        n_q = min(tail.inputs_embeds.shape[1], LOOK_TOKENS)  # the read's cost is bounded, not the question's
        probs = torch.stack([question_attention(adapter, i, torch.cat(seen.seen[i], 1), positions, mask, n_q)
                             for i in layers], 1)  # [B, layers, H, Q, L]
        attention = []
        for b, (pre, vis, suf) in enumerate(zip(prefixes, gestalt, suffixes)):
            g0 = head.inputs_embeds.shape[1] - len(vis)  # the gestalt is the last part of the left-padded head
            attention.append(probs[b, :, :, n_q - min(len(suf), n_q):, g0:g0 + len(vis)])
    return FirstLook(cache, head.attention_mask, list(gestalt), [tuple(g) for g in grids], prefixes, suffixes,
                     attention, layers)


def second_pass_prefill(adapter: VLMAdapter, first: FirstLook, visuals: Sequence[VisualTokens]) -> Prefill:
    """The saccades and the question of each prompt, to run on top of ``first.cache``.

    ``visuals[b]`` is the image's full visual set (gestalt first, then saccades, with the positions
    ``encode`` gives them); its gestalt must be the one the first look prefilled.
    """
    if len(visuals) != len(first.gestalt):
        raise ValueError(f"need one visual set per prompt of the first look ({len(first.gestalt)}), got {len(visuals)}")
    sacc, pos, starts, deep = [], [], [], []
    for vis, g, pre in zip(visuals, first.gestalt, first.prefixes):
        n = vis.n_gestalt
        if n != len(g) or not torch.equal(vis.positions[:, :n], g.positions):
            raise ValueError("the visual tokens' gestalt is not the one the first look prefilled")
        sacc.append(vis.embeds[n:])
        pos.append(vis.positions[:, n:].float() + len(pre))
        starts.append(float(len(pre) + vis.extent))
        deep.append([d[n:] for d in vis.deepstack])
    return chunk(adapter.embed_tokens, sacc, pos, first.suffixes, starts, adapter.rope_rows, deep)
