"""The answer cross-entropy of a frozen VLM as a training signal for per-cell selection weights.

Shapes: ``B`` examples, ``Hc, Wc`` token cells of an image, ``N = Hc * Wc`` its visual tokens, ``L``
padded sequence length, ``T`` answer tokens (+ eos), ``D`` LLM width, ``V`` vocabulary.

:func:`answer_loss` scores a reference answer under teacher forcing while every full-resolution
visual token is scaled by its cell's weight, exactly as ``encode(mode="weighted")`` scales it (the
``weighted`` relaxation), or while only a candidate set of cells -- e.g. the top 2K of the current
relevance -- is encoded sparse, as inference encodes its top K, each token scaled by its weight (the
``candidates`` relaxation; :func:`relaxation_gap` measures both against the exact path). The
vision tower runs once without gradient; the scaling, the LLM and the LM head are differentiable
in their inputs, so the gradient reaches the weights -- e.g. ``soft_topk`` of a learnable relevance
map -- while the VLM stays frozen: the caller sets ``adapter.model.requires_grad_(False)``, and a
model that would collect gradients or run in training mode (dropout) is refused.

>>> import torch
>>> from arr_coc.engine.soft_topk import soft_topk
>>> from arr_coc.vlm import load_vlm
>>> adapter = load_vlm("tiny:qwen2_5_vl")  # random weights: the loss value is noise, the gradient path is real
>>> _ = adapter.model.requires_grad_(False)
>>> relevance = torch.nn.Parameter(torch.linspace(-1, 1, 6).view(2, 3))  # [Hc, Wc]
>>> weights = soft_topk(relevance.flatten()[None], 2, temperature=0.5).view(2, 3)  # two cells' worth
>>> loss = answer_loss(adapter, [torch.rand(3, 56, 84)], ["What is the total?"], ["42"], [weights])
>>> loss.backward()
>>> relevance.grad.shape, bool(relevance.grad.abs().sum() > 0)
(torch.Size([2, 3]), True)
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.vlm.processing import VisualTokens, assemble
from arr_coc.vlm.protocol import VLMAdapter

REDUCTIONS = ("mean", "none")


def check_frozen(adapter: VLMAdapter) -> None:
    """Raise unless the adapter's model is frozen: no parameter requires grad and it is in eval mode.

    Checking rather than toggling ``requires_grad`` keeps the caller's model untouched: a backward
    pass through a model whose parameters require grad would fill their ``.grad`` (and cost the
    memory of those gradients), and training mode would make the loss random through dropout.
    """
    model = getattr(adapter, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"the adapter must hold its VLM as a torch module in .model, got {type(model).__name__}")
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    if trainable:
        raise ValueError(f"the VLM must be frozen, but {len(trainable)} parameters require grad (e.g. "
                         f"{trainable[0]}); call adapter.model.requires_grad_(False) first")
    if model.training:
        raise ValueError("the VLM is in training mode; call adapter.model.eval() so dropout stays off")


def eos_token_id(adapter: VLMAdapter) -> int | None:
    """The token that ends an answer: the LLM config's eos (the first of a list), else the tokenizer's."""
    eos = getattr(adapter.text_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is None:
        eos = getattr(adapter.tokenizer, "eos_token_id", None)
    return None if eos is None else int(eos)


def answer_ids(adapter: VLMAdapter, answer: str) -> list[int]:
    """Target ids of one answer: its tokens as they follow the prompt, then eos (when the model has one)."""
    if adapter.tokenizer is None:
        raise ValueError("this adapter has no tokenizer; pass tokenizer= or processor=")
    ids = adapter.tokenizer(answer, add_special_tokens=False)["input_ids"] if answer.strip() else []
    if not ids:
        raise ValueError(f"answers must be non-empty text, got {answer!r}")
    eos = eos_token_id(adapter)
    return list(ids) + ([] if eos is None else [eos])


def weighted_tokens(visual: VisualTokens, weight: Tensor) -> VisualTokens:
    """The tokens [N, D] after the gestalt scaled by their weights ([Hc, Wc] map in raster order, or [N]), with gradient.

    Gestalt tokens and Qwen3-VL's deepstack features pass unscaled, as in weighted mode, so the loss
    at a weight map is the loss of what ``encode(mode="weighted")`` sends the LLM.
    """
    scale = weight.reshape(-1, 1).to(device=visual.embeds.device, dtype=visual.embeds.dtype)  # [N, 1]
    if visual.n_gestalt:
        scale = torch.cat([scale.new_ones(visual.n_gestalt, 1), scale])
    return VisualTokens(visual.embeds * scale, visual.positions, visual.n_gestalt, visual.deepstack,
                        visual.vision_segments)


@contextmanager
def activation_checkpointing(model: torch.nn.Module) -> Iterator[int]:
    """Inside, every transformer layer of ``model`` (vision blocks, LLM decoder layers) keeps only its
    input for the backward pass and recomputes the rest there; yields how many layers that is.

    transformers checkpoints a layer only while checkpointing is enabled on the model *and* that
    layer is in training mode, but a frozen VLM stays in eval mode. So checkpointing is enabled with
    transformers' own ``activation_checkpointing_enable`` -- non-reentrant ``torch.utils.checkpoint``,
    through which the gradient reaches inputs that require it (the selection weights) although no
    parameter does -- and only the layer modules' own ``training`` flag is set while inside. Their
    submodules (attention, MLP) stay in eval mode, so no dropout switches on; on exit the flags are
    restored and the model computes exactly as before.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers or not hasattr(model, "activation_checkpointing_enable"):
        raise ValueError(f"{type(model).__name__} has no transformers layers to checkpoint")
    if not model.is_activation_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    before = [m.training for m in layers]
    for m in layers:
        m.training = True
    try:
        yield len(layers)
    finally:
        for m, flag in zip(layers, before):
            m.training = flag


def check_inputs(adapter: VLMAdapter, images: Sequence[Tensor], questions: Sequence[str], answers: Sequence[str],
                 weights: Sequence[Tensor], reduction: str, cells: Sequence[Tensor] | None = None) -> None:
    """Raise a ValueError naming the first input that does not fit the others."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {', '.join(REDUCTIONS)}")
    n = len(images)
    if n == 0 or not (len(questions) == len(answers) == len(weights) == n):
        raise ValueError(f"need one question, answer and weight map per image, got {n} images, {len(questions)} "
                         f"questions, {len(answers)} answers and {len(weights)} weight maps")
    cell = adapter.cell
    for i, (img, w) in enumerate(zip(images, weights)):
        if img.ndim != 3 or img.shape[0] != 3 or img.shape[1] % cell or img.shape[2] % cell:
            raise ValueError(f"image {i} must be [3, H, W] with sides multiples of the {cell} px cell, "
                             f"got {tuple(img.shape)}")
        grid = (img.shape[1] // cell, img.shape[2] // cell)
        if not isinstance(w, Tensor) or tuple(w.shape) != grid or not w.is_floating_point():
            shape = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
            raise ValueError(f"weights {i} must be a float [{grid[0]}, {grid[1]}] map (one weight per cell of "
                             f"image {i}), got {shape}")
    if cells is not None and len(cells) != n:
        raise ValueError(f"need one cell set per image, got {len(cells)} for {n} images")


def answer_loss(adapter: VLMAdapter, images: Sequence[Tensor], questions: Sequence[str], answers: Sequence[str],
                weights: Sequence[Tensor], *, reduction: str = "mean", cells: Sequence[Tensor] | None = None,
                gestalt: Sequence[tuple[int, int] | None] | None = None, checkpointing: bool = False) -> Tensor:
    """Cross-entropy of each reference answer (+ eos) given its image's weighted visual tokens and question.

    Args:
        adapter: a VLM adapter (:func:`arr_coc.vlm.load_vlm`) whose model the caller froze with
            ``adapter.model.requires_grad_(False)`` and keeps in eval mode.
        images: each [3, H, W] in [0, 1], sides multiples of ``adapter.cell``.
        questions: one per image, wrapped in the adapter's chat template.
        answers: one per image, the text that should follow the generation prompt.
        weights: one [Hc, Wc] float map per image (typically in [0, 1]): the soft selection of each
            cell; the gradient of the loss flows into these.
        reduction: ``"mean"`` over the batch (a scalar) or ``"none"`` for the per-example [B] losses.
        cells: None encodes every cell at full resolution (the ``weighted`` relaxation); else per
            image the [M, 2] (y, x) cells to encode, in this order, as the sparse inference path does
            (the ``candidates`` relaxation; with weights of one at the top K it *is* that path).
            Either way each encoded token is scaled by its cell's weight.
        gestalt: per image the gestalt grid (rows, cols) whose unscaled tokens come first, or None.
        checkpointing: recompute the VLM's layer activations in the backward pass instead of keeping
            them (:func:`activation_checkpointing`): the same loss and gradient in less memory.

    Returns:
        The token-level cross-entropy averaged over each answer's tokens, then reduced over the batch.

    Raises:
        ValueError: mismatched lengths, a weight map of the wrong shape, an empty answer, an unknown
            reduction, or a VLM that is not frozen.
    """
    check_inputs(adapter, images, questions, answers, weights, reduction, cells)
    check_frozen(adapter)
    targets = [answer_ids(adapter, a) for a in answers]
    grids = [(img.shape[1] // adapter.cell, img.shape[2] // adapter.cell) for img in images]
    if cells is None:  # every token once at weight one, scaled below with gradient
        full = adapter.encode(images, [None] * len(images), mode="weighted", gestalt=gestalt,
                              weights=[torch.ones(g, device=w.device) for g, w in zip(grids, weights)])
        scales = [w.reshape(-1) for w in weights]
    else:  # only the chosen cells reach the tower, as at inference
        cells = [c.long() for c in cells]
        full = adapter.encode(images, cells, mode="sparse", gestalt=gestalt)
        scales = [w[c[:, 0].to(w.device), c[:, 1].to(w.device)] for w, c in zip(weights, cells)]
    # the tower ran without gradient (frozen, input fixed); the scaling, LLM and head are differentiable
    visuals = [weighted_tokens(v, s) for v, s in zip(full, scales)]
    prompts = [adapter.prompt_ids(q) for q in questions]
    # teacher forcing: the answer follows the prompt; left padding puts every answer at the end of its row
    prefill = assemble(adapter.embed_tokens, [p[0] for p in prompts], visuals,
                       [list(p[1]) + t for p, t in zip(prompts, targets)], adapter.rope_rows)
    with activation_checkpointing(adapter.model) if checkpointing else nullcontext():
        hidden = adapter.language_model(dict(inputs_embeds=prefill.inputs_embeds, attention_mask=prefill.attention_mask,
                                             position_ids=prefill.position_ids, visual_mask=prefill.visual_mask,
                                             deepstack=prefill.deepstack))  # [B, L, D]
    longest = max(map(len, targets))
    # position j predicts token j + 1: the last T hidden states before the final one score the answer
    logits = adapter.logits(hidden[:, -longest - 1:-1]).float()  # [B, T, V]
    labels = torch.full((len(targets), longest), -100, dtype=torch.long, device=logits.device)  # [B, T]
    for b, t in enumerate(targets):
        labels[b, longest - len(t):] = torch.tensor(t, device=logits.device)
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")  # [B, T]
    counts = torch.tensor([len(t) for t in targets], device=logits.device, dtype=nll.dtype)
    per_example = nll.sum(1) / counts  # [B]
    return per_example.mean() if reduction == "mean" else per_example


def top_cells(relevance: Tensor, m: int) -> Tensor:
    """The ``m`` most relevant cells of a [Hc, Wc] map, [m, 2] (y, x) in decreasing relevance.

    >>> top_cells(torch.tensor([[0.1, 0.9], [0.5, 0.2]]), 2).tolist()
    [[0, 1], [1, 0]]
    """
    idx = relevance.detach().flatten().topk(min(m, relevance.numel())).indices
    return torch.stack([idx // relevance.shape[1], idx % relevance.shape[1]], 1)


def relaxation_gap(adapter: VLMAdapter, images: Sequence[Tensor], questions: Sequence[str], answers: Sequence[str],
                   relevance: Sequence[Tensor], ks: Sequence[int], *, temperature: float = 0.5,
                   candidates: int = 2, gestalt: Sequence[tuple[int, int] | None] | None = None,
                   straight_through: bool = False) -> dict[str, Tensor]:
    """Per-example losses [B] of the exact sparse inference path and of both relaxations at one relevance.

    ``exact``: the top K cells of the relevance, encoded sparse, weight one (what inference sends).
    ``weighted``: every cell encoded, scaled by the soft top-K of the (z-scored) relevance.
    ``candidates``: only the top ``candidates * K`` cells encoded, scaled by the same soft weights.
    ``gap_weighted`` and ``gap_candidates`` are each relaxation's loss minus the exact loss.
    """
    from arr_coc.engine.soft_topk import soft_topk

    soft, top, cand = [], [], []
    for r, k in zip(relevance, ks):
        z = (r - r.mean()) / r.std().clamp_min(1e-6)  # the training loop's z-scoring
        soft.append(soft_topk(z.flatten()[None], k, temperature, straight_through=straight_through)[0].view_as(r))
        top.append(top_cells(r, k))
        cand.append(top_cells(r, candidates * k))
    ones = [torch.ones_like(r) for r in relevance]
    kw = dict(reduction="none", gestalt=gestalt)
    with torch.no_grad():
        exact = answer_loss(adapter, images, questions, answers, ones, cells=top, **kw)
        weighted = answer_loss(adapter, images, questions, answers, soft, **kw)
        candidate = answer_loss(adapter, images, questions, answers, soft, cells=cand, **kw)
    return {"exact": exact, "weighted": weighted, "candidates": candidate,
            "gap_weighted": weighted - exact, "gap_candidates": candidate - exact}
