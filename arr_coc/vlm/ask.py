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

from arr_coc.config import MAX_NEW_TOKENS, ARRConfig, SamplerConfig, check_int, resolve_device, resolve_dtype
from arr_coc.samplers import shift_nonnegative
from arr_coc.allocators.patching import PATCHERS, BudgetTooSmallError
from arr_coc.vlm.base import ADAPTERS, VisualTokens, assemble, flops_estimate, generate, llm_chunk_flops, timed

WEIGHT_FLOOR = 0.5  # weighted mode: the least relevant token keeps half its embedding, none vanishes


def load_vlm(name_or_path: str, *, dtype: Any = None, device: Any = None) -> Any:
    """An adapter around a checkpoint folder or hub id (``from_pretrained``), or ``tiny:<family>``.

    The adapter is chosen from the config's ``model_type`` in the ``ADAPTERS`` registry.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    # checked before anything loads: a wrong name or a GPU this torch cannot reach fails in a second
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(f"model must be a checkpoint folder, a hub id or tiny:<family>, got {name_or_path!r}")
    if name_or_path.startswith("tiny:"):
        from arr_coc.vlm.tiny import tiny_image_processor, tiny_model, tiny_tokenizer

        family = name_or_path.split(":", 1)[1]
        if family == "llava":
            from arr_coc.vlm.tiny import tiny_llava_model, tiny_llava_tokenizer

            return ADAPTERS.get("llava")(_placed(tiny_llava_model(), dtype, device), tiny_llava_tokenizer())
        ADAPTERS.get(family)  # an unknown family lists the registered ones
        ip = tiny_image_processor(family)
        return ADAPTERS.get(family)(_placed(tiny_model(family), dtype, device), tiny_tokenizer(),
                                    image_mean=ip.image_mean, image_std=ip.image_std)
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())  # transformers words it over several lines; a user error is one
        raise ValueError(f"cannot load a VLM config from {name_or_path!r}: {reason}") from err
    adapter_cls = ADAPTERS.get(config.model_type)  # unknown families raise with the registered names
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype or "auto")
    if device is not None:
        model = model.to(device)
    processor, tokenizer, mean, std = _processor_parts(name_or_path)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return adapter_cls(model, tokenizer, processor=processor, image_mean=mean, image_std=std)


def _placed(model: Any, dtype: torch.dtype | None, device: torch.device | None) -> Any:
    """A model built here (not loaded) moved to the asked dtype and device, as from_pretrained would."""
    return model.to(**{k: v for k, v in (("dtype", dtype), ("device", device)) if v is not None})


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


RELEVANCE_SOURCES = ("arr", "vlm")


def default_relevance(adapter: Any) -> str:
    """``"vlm"`` where the model runs on CUDA and can read its gestalt alone, else ``"arr"``.

    On a GPU the first look costs the question's tokens once more, milliseconds, while ARR's
    default channels run OCR on the CPU for about a second: longer than the VLM's whole answer.
    On the CPU both are small next to the sparse path (benchmarks/bench_vlm.py: 8 % and 4 % on
    Qwen2.5-VL-3B), and ARR's relevance is the one whose quality has been measured.
    """
    return "vlm" if model_device(adapter).type == "cuda" and hasattr(adapter, "encode_gestalt") else "arr"


@dataclass
class Answer:
    """One question's answer and what it cost against the model's full-resolution input."""

    question: str
    text: str
    tokens: list[int]
    gestalt_tokens: int
    saccades: int
    full_tokens: int  # visual tokens of the full-resolution image
    flops: dict[str, float]  # estimated FLOPs sent: llm, vision (prefill), allocation (the VLM's first look), total
    flops_full: dict[str, float]  # the same at full resolution
    # allocator "arr": [K, 2] (y, x) saccade cells in relevance order; a patch allocator: [K, 3]
    # (y, x, size) squares in cells, in the allocator's order, one token each (K = saccades sent)
    cells: torch.Tensor = field(repr=False)
    allocator: str = "arr"  # who chose the saccades: "arr" (sampler) or a PATCHERS name
    relevance: str = "arr"  # where relevance came from: "arr" (texture + OCR scorer) or "vlm" (its first look)
    # wall milliseconds of the whole call (the batch) per stage: "allocation/<stage>" (ARR's stages,
    # "allocation/channel/<name>" inside its texture and coupling; or the first look), "vision...",
    # "prefill...", "decode"
    timings_ms: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def visual_tokens(self) -> int:
        return self.gestalt_tokens + self.saccades

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds per stage group: allocation, vision, prefill, decode (channel details not added twice)."""
        out = {"allocation": 0.0, "vision": 0.0, "prefill": 0.0, "decode": 0.0}
        for name, ms in self.timings_ms.items():
            group = name.split("/", 1)[0]
            if group in out and not name.startswith("allocation/channel/"):
                out[group] += ms
        return out

    def to_json(self) -> dict[str, Any]:
        """The answer, the tokens sent and full, FLOPs and stage times, as plain JSON-able data."""
        stages = self.stage_ms()
        return {
            "question": self.question,
            "answer": self.text,
            "relevance": self.relevance,
            "allocator": self.allocator,
            "tokens": {"sent": self.visual_tokens, "gestalt": self.gestalt_tokens, "saccades": self.saccades,
                       "full_resolution": self.full_tokens},
            "flops": {k: float(v) for k, v in self.flops.items()},
            "flops_full": {k: float(v) for k, v in self.flops_full.items()},
            "time_ms": {**{k: round(v, 2) for k, v in stages.items()}, "total": round(sum(stages.values()), 2)},
            "stages_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
        }


def relevance_weights(relevance: torch.Tensor, valid: torch.Tensor, floor: float = WEIGHT_FLOOR) -> torch.Tensor:
    """Weighted mode (seed Option C): relevance min-max scaled per image into [floor, 1]; [B, Hc, Wc].

    >>> relevance_weights(torch.tensor([[[0., 2.], [4., 9.]]]), torch.tensor([[[True, True], [True, False]]]))
    tensor([[[0.5000, 0.7500],
             [1.0000, 0.5000]]])
    """
    shifted, span = shift_nonnegative(relevance, valid)  # [B, Hc, Wc], [B, 1, 1]
    unit = (shifted / span.clamp_min(1e-12)).clamp(0, 1)
    return (floor + (1 - floor) * unit).masked_fill(~valid, floor)


def prefill_flops(adapter: Any, prompt_tokens: int, segments: Sequence[int], look_tokens: int = 0,
                  look_past: int = 0) -> dict[str, float]:
    """Estimated prefill FLOPs (llm, vision, allocation, total) of a prompt of ``prompt_tokens`` whose image the
    tower encoded in attention ``segments`` of patches (:func:`arr_coc.vlm.base.flops_estimate`); allocation:
    a first look's ``look_tokens`` question tokens read over ``look_past`` cached ones (0 without one)."""
    cfg_t, cfg_v = adapter.text_config, adapter.model.config.vision_config
    llm = sum(p.numel() for p in adapter.lm.layers.parameters())
    vit = sum(p.numel() for p in adapter.visual.parameters())
    depth = getattr(cfg_v, "depth", None) or cfg_v.num_hidden_layers  # Qwen towers say depth, CLIP num_hidden_layers
    window, full = None, None
    if getattr(cfg_v, "fullatt_block_indexes", None) is not None and getattr(cfg_v, "window_size", None):
        window = (cfg_v.window_size // cfg_v.patch_size) ** 2  # patches per window
        full = len(cfg_v.fullatt_block_indexes)
    out = flops_estimate(llm, cfg_t.num_hidden_layers, cfg_t.hidden_size, prompt_tokens, vit,
                         depth, getattr(cfg_v, "embed_dim", None) or cfg_v.hidden_size, segments,
                         vit_window=window, vit_full_layers=full)
    out["allocation"] = llm_chunk_flops(llm, cfg_t.num_hidden_layers, cfg_t.hidden_size, look_tokens, look_past)
    out["total"] += out["allocation"]
    return out


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


def model_device(adapter: Any) -> torch.device:
    """Where the adapter's language model sits: the first look and the second pass run there."""
    return next(adapter.lm.parameters()).device


def allocators() -> tuple[str, ...]:
    """What :func:`ask` can allocate saccades with: ``"arr"`` (ARR's sampler), then every patch allocator.

    >>> allocators()[0], {"saliency", "quadtree"} <= set(allocators())
    ('arr', True)
    """
    return ("arr", *PATCHERS.names())


def patch_boxes(name: str, alloc: Any, budget: int) -> list[torch.Tensor]:
    """Per image the [K_b, 3] (y, x, size) squares of patch allocator ``name`` on ARR's relevance (K_b <= budget)."""
    return patch_boxes_on(name, alloc.relevance.map, alloc.canvas, budget)


def patch_boxes_on(name: str, relevance: torch.Tensor, canvas: Any, budget: int) -> list[torch.Tensor]:
    """Per image the [K_b, 3] (y, x, size) squares of patch allocator ``name`` on a relevance map (K_b <= budget).

    The allocator gets ``relevance`` [B, Hc, Wc] with the canvas's valid cells and pixels;
    padding rows (size 0) are dropped, so K_b counts the tokens image b really sends.
    """
    valid = canvas.valid.to(relevance.device)
    try:
        patches = PATCHERS.get(name)(relevance.detach(), budget, valid=valid, pixels=canvas.pixels.to(relevance.device))
    except BudgetTooSmallError as err:  # a quadtree cannot start below its first tiling
        raise BudgetTooSmallError(f"allocator {name!r} needs a larger budget: {err}; raise --budget (budget=) to "
                                  f"at least {err.minimum}", err.k, err.minimum) from err
    return [patches.boxes[b, :n] for b, n in enumerate(patches.counts.tolist())]


def ask(adapter: Any, images: Any, questions: str | Sequence[str], *, arr: Any = None, budget: int | None = None,
        mode: str = "sparse", layout: str = "scaled", gestalt: bool = True, max_new_tokens: int = MAX_NEW_TOKENS,
        config: ARRConfig | None = None, allocator: str = "arr", relevance: str = "auto",
        look_layers: Sequence[int] | None = None) -> list[Answer]:
    """Allocate saccades with arr-coc, then let the frozen VLM answer from gestalt + saccades.

    Args:
        adapter: a VLM adapter (:func:`load_vlm`); its cell sets the canvas cell.
        images: what :class:`arr_coc.ARR` accepts (paths, PIL images, tensors; one or a list).
        questions: one per image.
        arr: an ARR whose canvas cell equals ``adapter.cell``; built from ``config`` when None. Its
            canvas, gestalt rule and sampler serve both relevance sources.
        budget: saccades per image (default: the config's sampler budget); a patch allocator's K
            (quadtree: at most K, and at least its starting tiling).
        mode, layout: see :meth:`arr_coc.vlm.qwen.QwenVLAdapter.encode`; patch allocators need
            ``mode="sparse"``.
        gestalt: send the gestalt (the config's grid for the budget) before the saccades.
        allocator: ``"arr"``: one-cell saccades from ARR's sampler; a :data:`arr_coc.patching.PATCHERS`
            name: variable-size squares on the relevance map, each one token (``Answer.cells`` then
            holds the [K, 3] boxes and ``Answer.saccades`` their count).
        relevance: ``"arr"``: ARR's scorer on its texture channels (OCR included by default; on the
            CPU). ``"vlm"``: the VLM's first look (:mod:`arr_coc.vlm.look`): the model encodes the
            gestalt, reads the question over it, and its attention to each gestalt token, spread
            over the cells, is the relevance; the answer then reuses that prefill. Everything runs
            on the model's device. ``"auto"``: :func:`default_relevance`.
        look_layers: decoder layers the first look reads (default: the middle half).
    """
    from arr_coc.vlm.base import LAYOUTS, MODES

    if allocator not in allocators():
        raise ValueError(f"unknown allocator {allocator!r}; choose one of {', '.join(allocators())}")
    for name, value, choices in (("mode", mode, MODES), ("layout", layout, LAYOUTS)):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens)
    if budget is not None:
        budget = check_int("budget", budget)
    if relevance == "auto":
        relevance = default_relevance(adapter)
    if relevance not in RELEVANCE_SOURCES:
        raise ValueError(f"unknown relevance source {relevance!r}; choose one of auto, {', '.join(RELEVANCE_SOURCES)}")
    if allocator != "arr" and mode != "sparse":
        raise ValueError(f"allocator {allocator!r} sends variable-size patches, which only mode='sparse' encodes "
                         f"(got mode={mode!r}); use mode='sparse' or allocator='arr'")
    if relevance == "vlm":
        _check_look(adapter, mode, gestalt, "relevance 'vlm'")
    if arr is None:
        from arr_coc.pipeline import ARR

        config = config or ARRConfig()
        config = replace(config, canvas=replace(config.canvas, cell=adapter.cell))
        arr = ARR(config)
    if arr.config.canvas.cell != adapter.cell:
        raise ValueError(f"the ARR canvas cell is {arr.config.canvas.cell} px but {adapter.name} needs "
                         f"{adapter.cell} px; build ARRConfig(canvas=CanvasConfig(cell={adapter.cell}))")
    k = budget if budget is not None else arr.config.sampler.saccades
    t: dict[str, float] = {}
    run = _ask_vlm if relevance == "vlm" else _ask_arr
    return run(adapter, images, questions, arr, k, mode, layout, gestalt, max_new_tokens, allocator, look_layers, t)


def _look(adapter: Any, canvas: Any, queries: Sequence[str], arr: Any, k: int, layers: Any,
          t: dict[str, float]) -> dict[str, Any]:
    """The first look at every image of a canvas: its images on the model's device, grids, gestalt tokens, look."""
    from arr_coc.vlm.look import first_look

    cell, device = adapter.cell, model_device(adapter)
    imgs = [canvas.pixels[b, :, :h, :w].to(device) for b, (h, w) in enumerate(canvas.sizes)]
    grids = [(h // cell, w // cell) for h, w in canvas.sizes]
    gestalts = [arr.config.gestalt.grid_for(k, g) for g in grids]
    with timed(t, "vision/gestalt", device):
        seen = adapter.encode_gestalt(imgs, gestalts)
    look = first_look(adapter, seen, gestalts, list(queries), layers=layers, timings=t)
    return dict(imgs=imgs, grids=grids, gestalts=gestalts, seen=seen, look=look)


def _check_look(adapter: Any, mode: str, gestalt: bool, why: str) -> None:
    if mode == "weighted" or not gestalt:
        raise ValueError(f"{why} reads the VLM's look at the gestalt, which "
                         f"{'mode weighted' if gestalt else 'no gestalt'} does not send; use mode 'sparse' or "
                         "'slice' with the gestalt, or relevance 'arr'")
    if not hasattr(adapter, "encode_gestalt"):
        raise ValueError(f"{why} needs an adapter that encodes the gestalt alone (the Qwen-VL "
                         f"families); {adapter.name} has none: use relevance 'arr'")


def _ask_arr(adapter: Any, images: Any, questions: Any, arr: Any, k: int, mode: str, layout: str, gestalt: bool,
             max_new_tokens: int, allocator: str, look_layers: Any, t: dict[str, float]) -> list[Answer]:
    """Relevance from ARR's scorer, then one pass: prefix, gestalt, saccades, question.

    With the ``first_look`` channel among ARR's channels, the VLM's first look feeds the scorer
    and the answer continues its cache, as with the ``vlm`` source.
    """
    seen: dict[str, Any] = {}
    coupled = None
    if "first_look" in arr.query_channels:
        _check_look(adapter, mode, gestalt, "the first_look channel")

        def coupled(canvas: Any, queries: list[str]) -> dict[str, torch.Tensor]:
            seen.update(_look(adapter, canvas, queries, arr, k, look_layers, t))
            return {"first_look": seen["look"].relevance_map(seen["grids"], canvas.grid)[:, None]}

    alloc = arr(images, questions, saccades=k, coupled=coupled)
    t.update({f"allocation/{name}": ms for name, ms in alloc.timings_ms.items()})
    canvas, cell, device = alloc.canvas, adapter.cell, model_device(adapter)
    imgs = [canvas.pixels[b, :, :h, :w] for b, (h, w) in enumerate(canvas.sizes)]
    grids = [(h // cell, w // cell) for h, w in canvas.sizes]
    # weighted mode already sends every cell of the image: a gestalt would repeat it
    gestalts = [arr.config.gestalt.grid_for(k, g) if gestalt and mode != "weighted" else None for g in grids]
    weights = None
    if mode == "weighted":
        w = relevance_weights(alloc.relevance.map, canvas.valid)
        weights = [w[b, :g[0], :g[1]] for b, g in enumerate(grids)]
    reuse = seen.get("seen")
    with timed(t, "vision", device):
        if allocator == "arr":
            cells = [alloc.positions[b] for b in range(canvas.batch_size)]
            visual: list[VisualTokens] = adapter.encode(imgs, cells, mode=mode, gestalt=gestalts, layout=layout,
                                                        weights=weights, **({"encoded": reuse} if reuse else {}))
        else:
            cells = patch_boxes(allocator, alloc, k)
            visual = adapter.encode_patches(imgs, cells, gestalt=gestalts, layout=layout,
                                            **({"encoded": reuse} if reuse else {}))
    eos = adapter.text_config.eos_token_id
    if reuse:
        from arr_coc.vlm.look import second_pass

        look = seen["look"]
        tokens, _ = second_pass(adapter, look, visual, max_new_tokens=max_new_tokens, eos_token_id=eos, timings=t)
        prompts = list(zip(look.prefixes, look.suffixes))
        return _answers(adapter, alloc.queries, tokens, visual, prompts, grids, cells, allocator, "arr", t,
                        [len(p[0]) + len(v) for p, v in zip(prompts, reuse)])
    prompts = [adapter.prompt_ids(q) for q in alloc.queries]
    prefill = assemble(adapter.embed_tokens, [p[0] for p in prompts], visual, [p[1] for p in prompts],
                       adapter.rope_rows)
    tokens, _ = generate(adapter, prefill, max_new_tokens=max_new_tokens, eos_token_id=eos, timings=(g := {}))
    t.update(prefill=g["prefill_ms"], decode=g["decode_ms"])
    return _answers(adapter, alloc.queries, tokens, visual, prompts, grids, cells, allocator, "arr", t)


def _ask_vlm(adapter: Any, images: Any, questions: Any, arr: Any, k: int, mode: str, layout: str, gestalt: bool,
             max_new_tokens: int, allocator: str, look_layers: Any, t: dict[str, float]) -> list[Answer]:
    """Relevance from the VLM's first look at the gestalt; the answer continues its KV cache."""
    from arr_coc.canvas import make_canvas
    from arr_coc.query import check_queries
    from arr_coc.vlm.look import second_pass

    cfg, device = arr.config.canvas, model_device(adapter)
    with timed(t, "allocation/canvas"):  # decoding and resizing the images: every path does it
        canvas = make_canvas(images, cell=adapter.cell, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
        queries = check_queries(questions, canvas.batch_size)
    lk = _look(adapter, canvas, queries, arr, k, look_layers, t)
    imgs, grids, gestalts, seen, look = lk["imgs"], lk["grids"], lk["gestalts"], lk["seen"], lk["look"]
    with timed(t, "allocation/relevance", device):
        rel = look.relevance_map(grids, canvas.grid)  # [B, Hc, Wc]
        valid = canvas.valid.to(device)
    with timed(t, "allocation/selection", device):
        if allocator == "arr":
            generator = torch.Generator().manual_seed(arr.config.seed)
            sel = arr.sampler(rel, k, valid=valid, generator=generator)
            cells = [sel.positions[b] for b in range(canvas.batch_size)]
        else:
            cells = patch_boxes_on(allocator, rel, canvas, k)
    with timed(t, "vision", device):
        if allocator == "arr":
            visual = adapter.encode(imgs, cells, mode=mode, gestalt=gestalts, layout=layout, encoded=seen)
        else:
            visual = adapter.encode_patches(imgs, cells, gestalt=gestalts, layout=layout, encoded=seen)
    eos = adapter.text_config.eos_token_id
    tokens, _ = second_pass(adapter, look, visual, max_new_tokens=max_new_tokens, eos_token_id=eos, timings=t)
    prompts = list(zip(look.prefixes, look.suffixes))
    return _answers(adapter, queries, tokens, visual, prompts, grids, cells, allocator, "vlm", t,
                    [len(p[0]) + len(v) for p, v in zip(prompts, seen)])


def _answers(adapter: Any, queries: Sequence[str], tokens: torch.Tensor, visual: Sequence[VisualTokens],
             prompts: Sequence[tuple[list[int], list[int]]], grids: Sequence[tuple[int, int]],
             cells: Sequence[torch.Tensor], allocator: str, relevance: str, t: dict[str, float],
             look_past: Sequence[int] | None = None) -> list[Answer]:
    answers = []
    for b, (vis, (pre, suf)) in enumerate(zip(visual, prompts)):
        text, toks = answer_text(adapter, tokens[b].tolist())
        full = grids[b][0] * grids[b][1]
        look = (len(suf), look_past[b]) if look_past is not None else (0, 0)
        answers.append(Answer(queries[b], text, toks, vis.n_gestalt, len(vis) - vis.n_gestalt, full,
                              prefill_flops(adapter, len(pre) + len(vis) + len(suf), vis.vision_segments, *look),
                              prefill_flops(adapter, len(pre) + full + len(suf), (full * adapter.merge ** 2,)),
                              cells[b].cpu(), allocator, relevance, dict(t)))
    return answers
