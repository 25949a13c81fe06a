"""Ask a frozen VLM about images with gestalt + saccades: load, allocate, encode, assemble, decode.

Saccades are one-cell tokens from ARR's sampler (``allocator="arr"``) or variable-size squares from a
patch allocator of :data:`arr_coc.patching.PATCHERS` (``"saliency"``, ``"quadtree"``) run on the
same ARR relevance, each square shrunk to one token (``adapter.encode_patches``).

>>> from arr_coc.vlm import load_vlm
>>> adapter = load_vlm("tiny:qwen2_5_vl")  # random weights: the answer is noise, the plumbing is real
>>> adapter.cell
28
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch

from arr_coc.config import ARRConfig, SamplerConfig
from arr_coc.allocators.patching import PATCHERS
from arr_coc.vlm.base import ADAPTERS, VisualTokens, assemble, flops_estimate, generate

WEIGHT_FLOOR = 0.5  # weighted mode: the least relevant token keeps half its embedding, none vanishes


def load_vlm(name_or_path: str, *, dtype: Any = None, device: Any = None) -> Any:
    """An adapter around a checkpoint folder or hub id (``from_pretrained``), or ``tiny:<family>``.

    The adapter is chosen from the config's ``model_type`` in the ``ADAPTERS`` registry.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    if name_or_path.startswith("tiny:"):
        from arr_coc.vlm.tiny import tiny_image_processor, tiny_model, tiny_tokenizer

        family = name_or_path.split(":", 1)[1]
        if family == "llava":
            from arr_coc.vlm.tiny import tiny_llava_model, tiny_llava_tokenizer

            return ADAPTERS.get("llava")(tiny_llava_model(), tiny_llava_tokenizer())
        ip = tiny_image_processor(family)
        return ADAPTERS.get(family)(tiny_model(family), tiny_tokenizer(), image_mean=ip.image_mean,
                                    image_std=ip.image_std)
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load a VLM config from {name_or_path!r}: {err}") from err
    adapter_cls = ADAPTERS.get(config.model_type)  # unknown families raise with the registered names
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype or "auto")
    if device is not None:
        model = model.to(device)
    processor, tokenizer, mean, std = _processor_parts(name_or_path)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return adapter_cls(model, tokenizer, processor=processor, image_mean=mean, image_std=std)


def _processor_parts(path: str) -> tuple[Any, Any, Any, Any]:
    """The processor if it loads; else its parts (the video processor needs torchvision)."""
    from transformers import AutoImageProcessor, AutoProcessor

    try:
        proc = AutoProcessor.from_pretrained(path)
        ip = getattr(proc, "image_processor", None)
        return proc, getattr(proc, "tokenizer", None), getattr(ip, "image_mean", None), getattr(ip, "image_std", None)
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    try:
        ip = AutoImageProcessor.from_pretrained(path)
        return None, None, ip.image_mean, ip.image_std
    except (ImportError, OSError, ValueError):  # no preprocessor config: the adapter's family defaults
        return None, None, None, None


@dataclass
class Answer:
    """One question's answer and what it cost against the model's full-resolution input."""

    question: str
    text: str
    tokens: list[int]
    gestalt_tokens: int
    saccades: int
    full_tokens: int  # visual tokens of the full-resolution image
    flops: dict[str, float]  # estimated prefill FLOPs sent: llm, vision, total
    flops_full: dict[str, float]  # the same at full resolution
    # allocator "arr": [K, 2] (y, x) saccade cells in relevance order; a patch allocator: [K, 3]
    # (y, x, size) squares in cells, in the allocator's order, one token each (K = saccades sent)
    cells: torch.Tensor = field(repr=False)
    allocator: str = "arr"  # who chose the saccades: "arr" (sampler) or a PATCHERS name

    @property
    def visual_tokens(self) -> int:
        return self.gestalt_tokens + self.saccades


def relevance_weights(relevance: torch.Tensor, valid: torch.Tensor, floor: float = WEIGHT_FLOOR) -> torch.Tensor:
    """Weighted mode (seed Option C): relevance min-max scaled per image into [floor, 1]; [B, Hc, Wc].

    >>> relevance_weights(torch.tensor([[[0., 2.], [4., 9.]]]), torch.tensor([[[True, True], [True, False]]]))
    tensor([[[0.5000, 0.7500],
             [1.0000, 0.5000]]])
    """
    r = relevance.masked_fill(~valid, float("inf"))
    lo = r.flatten(1).amin(1).view(-1, 1, 1)
    hi = relevance.masked_fill(~valid, float("-inf")).flatten(1).amax(1).view(-1, 1, 1)
    unit = ((relevance - lo) / (hi - lo).clamp_min(1e-12)).clamp(0, 1)
    return (floor + (1 - floor) * unit).masked_fill(~valid, floor)


def prefill_flops(adapter: Any, prompt_tokens: int, segments: Sequence[int]) -> dict[str, float]:
    """Estimated prefill FLOPs (llm, vision, total) of a prompt of ``prompt_tokens`` whose image the tower
    encoded in attention ``segments`` of patches (:func:`arr_coc.vlm.base.flops_estimate`)."""
    cfg_t, cfg_v = adapter.text_config, adapter.model.config.vision_config
    llm = sum(p.numel() for p in adapter.lm.layers.parameters())
    vit = sum(p.numel() for p in adapter.visual.parameters())
    depth = getattr(cfg_v, "depth", None) or cfg_v.num_hidden_layers  # Qwen towers say depth, CLIP num_hidden_layers
    return flops_estimate(llm, cfg_t.num_hidden_layers, cfg_t.hidden_size, prompt_tokens, vit,
                          depth, getattr(cfg_v, "embed_dim", None) or cfg_v.hidden_size, segments)


def decode_flops(adapter: Any, prompt_tokens: int, new_tokens: int) -> float:
    """Estimated FLOPs of decoding ``new_tokens`` after a prompt: 2 per LLM weight per token, plus each
    token's attention over the cached context (the prefill estimate's convention)."""
    cfg = adapter.text_config
    llm = sum(p.numel() for p in adapter.lm.layers.parameters())
    context = sum(prompt_tokens + i for i in range(new_tokens))
    return 2.0 * llm * new_tokens + 4.0 * cfg.num_hidden_layers * cfg.hidden_size * context


def answer_text(adapter: Any, tokens: Sequence[int]) -> tuple[str, list[int]]:
    """Generated ids up to the first end-of-sequence token, and their text."""
    toks, eos = list(tokens), adapter.text_config.eos_token_id
    if eos is not None:
        stop = [eos] if isinstance(eos, int) else list(eos)
        toks = toks[:next((i for i, t in enumerate(toks) if t in stop), len(toks))]
    return adapter.tokenizer.decode(toks, skip_special_tokens=True).strip(), toks


def allocators() -> tuple[str, ...]:
    """What :func:`ask` can allocate saccades with: ``"arr"`` (ARR's sampler), then every patch allocator.

    >>> allocators()[0], {"saliency", "quadtree"} <= set(allocators())
    ('arr', True)
    """
    return ("arr", *PATCHERS.names())


def patch_boxes(name: str, alloc: Any, budget: int) -> list[torch.Tensor]:
    """Per image the [K_b, 3] (y, x, size) squares of patch allocator ``name`` on ARR's relevance (K_b <= budget).

    The allocator gets ``alloc.relevance.map`` [B, Hc, Wc] with the canvas's valid cells and pixels;
    padding rows (size 0) are dropped, so K_b counts the tokens image b really sends.
    """
    canvas = alloc.canvas
    try:
        patches = PATCHERS.get(name)(alloc.relevance.map.detach(), budget, valid=canvas.valid, pixels=canvas.pixels)
    except ValueError as err:
        if "starting squares" in str(err):  # a quadtree cannot start below its first tiling
            raise ValueError(f"allocator {name!r} needs a larger budget: {err}; raise --budget (budget=)") from err
        raise
    return [patches.boxes[b, :n] for b, n in enumerate(patches.counts.tolist())]


def ask(adapter: Any, images: Any, questions: str | Sequence[str], *, arr: Any = None, budget: int | None = None,
        mode: str = "sparse", layout: str = "scaled", gestalt: bool = True, max_new_tokens: int = 32,
        config: ARRConfig | None = None, allocator: str = "arr") -> list[Answer]:
    """Allocate saccades with arr-coc, then let the frozen VLM answer from gestalt + saccades.

    Args:
        adapter: a VLM adapter (:func:`load_vlm`); its cell sets the canvas cell.
        images: what :class:`arr_coc.ARR` accepts (paths, PIL images, tensors; one or a list).
        questions: one per image.
        arr: an ARR whose canvas cell equals ``adapter.cell``; built from ``config`` when None.
        budget: saccades per image (default: the config's sampler budget); a patch allocator's K
            (quadtree: at most K, and at least its starting tiling).
        mode, layout: see :meth:`arr_coc.vlm.qwen.QwenVLAdapter.encode`; patch allocators need
            ``mode="sparse"``.
        gestalt: send the gestalt (the config's grid for the budget) before the saccades.
        allocator: ``"arr"``: one-cell saccades from ARR's sampler; a :data:`arr_coc.patching.PATCHERS`
            name: variable-size squares on ARR's relevance, each one token (``Answer.cells`` then
            holds the [K, 3] boxes and ``Answer.saccades`` their count).
    """
    from arr_coc.pipeline import ARR

    if allocator not in allocators():
        raise ValueError(f"unknown allocator {allocator!r}; choose one of {', '.join(allocators())}")
    if allocator != "arr" and mode != "sparse":
        raise ValueError(f"allocator {allocator!r} sends variable-size patches, which only mode='sparse' encodes "
                         f"(got mode={mode!r}); use mode='sparse' or allocator='arr'")
    if arr is None:
        config = config or ARRConfig()
        config = replace(config, canvas=replace(config.canvas, cell=adapter.cell))
        arr = ARR(config)
    if arr.config.canvas.cell != adapter.cell:
        raise ValueError(f"the ARR canvas cell is {arr.config.canvas.cell} px but {adapter.name} needs "
                         f"{adapter.cell} px; build ARRConfig(canvas=CanvasConfig(cell={adapter.cell}))")
    k = budget if budget is not None else arr.config.sampler.budget
    alloc = arr(images, questions, budget=k)
    canvas, cell = alloc.canvas, adapter.cell
    imgs = [canvas.pixels[b, :, :h, :w] for b, (h, w) in enumerate(canvas.sizes)]
    grids = [(h // cell, w // cell) for h, w in canvas.sizes]
    # weighted mode already sends every cell of the image: a gestalt would repeat it
    gestalts = [arr.config.gestalt.grid_for(k, g) if gestalt and mode != "weighted" else None for g in grids]
    weights = None
    if mode == "weighted":
        w = relevance_weights(alloc.relevance.map, canvas.valid)
        weights = [w[b, :g[0], :g[1]] for b, g in enumerate(grids)]
    if allocator == "arr":
        cells = [alloc.positions[b] for b in range(canvas.batch_size)]
        visual: list[VisualTokens] = adapter.encode(imgs, cells, mode=mode, gestalt=gestalts, layout=layout,
                                                    weights=weights)
    else:
        cells = patch_boxes(allocator, alloc, k)
        visual = adapter.encode_patches(imgs, cells, gestalt=gestalts, layout=layout)
    prompts = [adapter.prompt_ids(q) for q in alloc.queries]
    prefill = assemble(adapter.embed_tokens, [p[0] for p in prompts], visual, [p[1] for p in prompts],
                       adapter.rope_rows)
    eos = adapter.text_config.eos_token_id
    tokens, _ = generate(adapter, prefill, max_new_tokens=max_new_tokens, eos_token_id=eos)
    answers = []
    for b, (vis, (pre, suf)) in enumerate(zip(visual, prompts)):
        text, toks = answer_text(adapter, tokens[b].tolist())
        full = grids[b][0] * grids[b][1]
        answers.append(Answer(alloc.queries[b], text, toks, vis.n_gestalt, len(vis) - vis.n_gestalt, full,
                              prefill_flops(adapter, len(pre) + len(vis) + len(suf), vis.vision_segments),
                              prefill_flops(adapter, len(pre) + full + len(suf), (full * adapter.merge ** 2,)),
                              cells[b].cpu(), allocator))
    return answers
