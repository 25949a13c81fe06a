"""The staged VLM path: allocate (one Plan per image), encode (Plans -> visual tokens), prefill, decode.

:func:`arr_coc.vlm.answer` is these four calls in a row; the VLM evaluation and ``benchmarks/bench_vlm.py``
call them too, timing or swapping one stage at a time.

* :func:`read_first_look` -- the VLM's first look at the gestalt, a relevance source of its own.
* :func:`allocate` -- relevance from ARR's scorer (``relevance="arr"``; with ARR's ``first_look``
  channel the VLM's first look feeds that scorer) or from the VLM's first look alone (``"vlm"``,
  :mod:`arr_coc.vlm.first_look`), then saccades from a sampler (:func:`sample_cells`) or squares from a
  patch allocator (:data:`arr_coc.allocators.patching.PATCHERS`): one :class:`arr_coc.engine.plan.Plan`
  per image, in a :class:`Planned` batch that carries the first look on.
* :func:`encode` -- cells through ``adapter.encode``, squares through ``encode_patches``, full
  through every cell, native through the model's own processor (``encode_processed``); a gestalt
  the first look encoded is reused.
* :func:`prefill` -- each prompt's text runs around its pages' visual tokens (one page or several: the
  pages of a context), or their continuation of the first look's cache.
* :func:`decode` -- the answer through the model's own ``generate`` (greedy by default, any
  ``GenerationConfig``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

import torch  # noqa: F401  (the doctests use it)
from torch import Tensor

from arr_coc.allocators.methods import METHODS, SamplerMethod, SquaresMethod
from arr_coc.allocators.patches import BudgetTooSmallError
from arr_coc.allocators.patching import PATCHERS
from arr_coc.config import MAX_NEW_TOKENS, ARRConfig
from arr_coc.engine.plan import Plan
from arr_coc.engine.samplers import SAMPLERS, Sampler, select
from arr_coc.engine.selection import shift_nonnegative
from arr_coc.threads import check_model
from arr_coc.vlm.first_look import FirstLook, first_look, second_pass_prefill
from arr_coc.vlm.generation import generate, timed
from arr_coc.vlm.processing import Prefill, VisualTokens, all_cells, assemble_context, left_pad_ids
from arr_coc.vlm.protocol import FIRST_LOOK, PROCESSOR, VLMAdapter

if TYPE_CHECKING:
    from arr_coc.engine.pipeline import ARR

RELEVANCE_SOURCES = ("arr", "vlm")
WEIGHT_FLOOR = 0.5  # weighted encoding: the least relevant token keeps half its embedding, none vanishes


def allocators() -> tuple[str, ...]:
    """What ``ask`` places saccades with: the method registry's (:data:`arr_coc.allocators.methods.METHODS`)
    methods that sample one-cell saccades with the ARR's own sampler on its scorer's relevance (``"arr"``), then
    those that place variable-size squares on that relevance, by their registry names.

    >>> allocators()
    ('arr', 'patches', 'quadtree')
    """
    methods = {name: METHODS.get(name) for name in METHODS.names()}
    cells = [n for n, m in methods.items() if isinstance(m, SamplerMethod) and m.sampler is None
             and m.source == "scorer" and m.encoding == "sparse"]
    squares = [n for n, m in methods.items() if isinstance(m, SquaresMethod) and m.source == "scorer"]
    return (*cells, *squares)


def patcher_of(allocator: Any) -> str | None:
    """The patch allocator (:data:`arr_coc.allocators.patching.PATCHERS`) a registry method places squares with,
    None for one-cell saccades.

    >>> patcher_of("patches"), patcher_of("quadtree"), patcher_of("arr")
    ('saliency', 'quadtree', None)
    """
    entry = METHODS.get(allocator) if isinstance(allocator, str) and allocator in METHODS else None
    return entry.patcher if isinstance(entry, SquaresMethod) else None


def default_relevance(adapter: VLMAdapter) -> str:
    """``"vlm"`` where the model runs on CUDA and has a first look, else ``"arr"``.

    On a GPU the first look costs the question's tokens once more, milliseconds, while ARR's
    default channels run OCR on the CPU for about a second: longer than the VLM's whole answer.
    On the CPU both are small next to the sparse path (benchmarks/bench_vlm.py: 8 % and 4 % on
    Qwen2.5-VL-3B), and ARR's relevance is the one whose quality has been measured.
    """
    return "vlm" if adapter.device.type == "cuda" and FIRST_LOOK in adapter.capabilities else "arr"


@dataclass
class Planned:
    """What :func:`allocate` decided for a batch: one Plan per image, and what the later stages need."""

    plans: list[Plan]
    images: list[Tensor]  # per image [3, H, W] in [0, 1] as the canvas holds it (sides multiples of the cell)
    queries: list[str]
    prompts: list[tuple[list[int], list[int]]]  # per image the token ids before and after the image
    relevance: str  # "arr" (ARR's scorer) or "vlm" (the VLM's first look)
    first_look: FirstLook | None = None  # the first look, when one ran: prefill continues its cache
    weights: list[Tensor] | None = None  # weighted encoding: per image [Hc, Wc] relevance weights
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def gestalt_tokens(self) -> list[VisualTokens] | None:
        """The gestalt tokens the first look encoded (encode reuses them), or None."""
        return None if self.first_look is None else self.first_look.gestalt


def relevance_weights(relevance: Tensor, valid: Tensor, floor: float = WEIGHT_FLOOR) -> Tensor:
    """Weighted encoding (seed Option C): relevance min-max scaled per image into [floor, 1]; [B, Hc, Wc].

    >>> relevance_weights(torch.tensor([[[0., 2.], [4., 9.]]]), torch.tensor([[[True, True], [True, False]]]))
    tensor([[[0.5000, 0.7500],
             [1.0000, 0.5000]]])
    """
    shifted, span = shift_nonnegative(relevance, valid)  # [B, Hc, Wc], [B, 1, 1]
    unit = (shifted / span.clamp_min(1e-12)).clamp(0, 1)
    return (floor + (1 - floor) * unit).masked_fill(~valid, floor)


def sample_cells(sampler: str | Sampler, relevance: Tensor, saccades: int, valid: Tensor, seed: int,
                 query_emb: Tensor | None = None) -> list[Tensor]:
    """The VLM path's one sampler call: per image the [K, 2] (y, x) cells ``sampler`` (a SAMPLERS name with its
    default parameters, or an instance) picks on ``relevance`` [B, Hc, Wc], drawing from a generator seeded
    with ``seed`` (``query_emb``: for a sampler that reads the question)."""
    if isinstance(sampler, str):
        sampler = SAMPLERS.get(sampler)()
    chosen = select(sampler, relevance, saccades, valid=valid, query_emb=query_emb, seed=seed)
    return [chosen.positions[b] for b in range(relevance.shape[0])]


def patch_squares(name: str, relevance: Tensor, canvas: Any, saccades: int) -> list[Tensor]:
    """Per image the [K_b, 3] (y, x, side) squares of patch allocator ``name`` on a relevance map (K_b <= saccades).

    The allocator gets ``relevance`` [B, Hc, Wc] with the canvas's valid cells and pixels;
    padding rows (side 0) are dropped, so K_b counts the tokens image b really sends.
    """
    valid = canvas.valid.to(relevance.device)
    try:
        patches = PATCHERS.get(name)(relevance.detach(), saccades, valid=valid,
                                     pixels=canvas.pixels.to(relevance.device))
    except BudgetTooSmallError as err:  # a quadtree cannot start below its first tiling
        raise BudgetTooSmallError(f"allocator {name!r} needs more saccades: {err}; raise --saccades (saccades=) "
                                  f"to at least {err.minimum}", err.k, err.minimum) from err
    return [patches.boxes[b, :n] for b, n in enumerate(patches.counts.tolist())]


def check_first_look(adapter: VLMAdapter, encoding: str, gestalt: bool, why: str) -> None:
    """Refuse in one line what a first look cannot do: no gestalt to look at, or a family without one."""
    if encoding == "weighted" or not gestalt:
        raise ValueError(f"{why} reads the VLM's look at the gestalt, which "
                         f"{'mode weighted' if gestalt else 'no gestalt'} does not send; use mode 'sparse' or "
                         "'slice' with the gestalt, or relevance 'arr'")
    adapter.require(FIRST_LOOK, why)


def arr_for(adapter: VLMAdapter, arr: ARR | None = None, config: ARRConfig | None = None) -> ARR:
    """``arr`` checked against the adapter's cell, or an ARR built from ``config`` on that cell."""
    if arr is None:
        from arr_coc.engine.pipeline import ARR

        config = config or ARRConfig()
        arr = ARR(replace(config, canvas=replace(config.canvas, cell=adapter.cell)))
    if arr.config.canvas.cell != adapter.cell:
        raise ValueError(f"the ARR canvas cell is {arr.config.canvas.cell} px but {adapter.name} needs "
                         f"{adapter.cell} px; build ARRConfig(canvas=CanvasConfig(cell={adapter.cell}))")
    return arr


def read_first_look(adapter: VLMAdapter, images: Sequence[Tensor], gestalts: Sequence[tuple[int, int]],
            questions: Sequence[str] | None = None, *,
            prompts: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None, layers: Sequence[int] | None = None,
            timings: dict[str, float] | None = None) -> FirstLook:
    """The VLM's first look: each image's gestalt (``gestalts[b]`` grid) encoded alone, then the question read
    over it (:func:`arr_coc.vlm.first_look.first_look`; ``prompts`` instead of chat-templated ``questions``).

    Its ``cell_maps`` are the relevance; its ``gestalt`` tokens and cache serve :func:`encode` and
    :func:`prefill`.
    ``timings`` collects ``vision/gestalt``, ``prefill/gestalt`` and ``allocation/first look``.
    """
    check_first_look(adapter, "sparse", True, "the first look")
    check_model(adapter, "the first look")
    device = adapter.device
    with timed(timings, "vision/gestalt", device):
        gestalt = adapter.encode_gestalt([img.to(device) for img in images], gestalts)
    if prompts is None:
        return first_look(adapter, gestalt, gestalts, list(questions or ()), layers=layers, timings=timings)
    return first_look(adapter, gestalt, gestalts, prompts=prompts, layers=layers, timings=timings)


def _first_looks(adapter: VLMAdapter, canvas: Any, queries: Sequence[str], prompts: Any, arr: ARR, k: int, layers: Any,
          t: dict[str, float]) -> FirstLook:
    """The first look at every image of a canvas (gestalt grids by ARR's rule for ``k`` saccades)."""
    cell = adapter.cell
    imgs = [canvas.pixels[b, :, :h, :w] for b, (h, w) in enumerate(canvas.sizes)]
    gestalts = [arr.config.gestalt.grid_for(k, (h // cell, w // cell)) for h, w in canvas.sizes]
    return read_first_look(adapter, imgs, gestalts, queries, prompts=prompts, layers=layers, timings=t)


def allocate(adapter: VLMAdapter, images: Any, questions: str | Sequence[str], *, saccades: int, arr: ARR | None = None,
             relevance: str = "arr", allocator: str | Sampler = "arr", encoding: str = "sparse",
             gestalt: bool = True, first_look_layers: Sequence[int] | None = None,
             prompts: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
             timings: dict[str, float] | None = None) -> Planned:
    """One :class:`arr_coc.engine.plan.Plan` per image: where the ``saccades`` go, and the gestalt sent before them.

    Args:
        adapter: the VLM (its cell is the canvas cell).
        images, questions: what :class:`arr_coc.ARR` accepts, one question per image.
        saccades: K per image (a patch allocator: at most K squares).
        arr: an ARR on the adapter's cell (:func:`arr_for`); its canvas, gestalt rule and seed serve
            both relevance sources, its sampler the ``arr`` one.
        relevance: ``"arr"``: ARR's scorer (the VLM's first look feeds it when ARR has the ``first_look``
            channel); ``"vlm"``: the VLM's first look alone.
        allocator: a method of the registry (:func:`allocators`): ``"arr"``, one-cell saccades from ARR's
            sampler; ``"patches"`` / ``"quadtree"``, variable-size squares on the relevance; or a SAMPLERS name
            or a Sampler: that sampler on the first look (``relevance="vlm"``).
        encoding: ``sparse``, ``slice`` (cells plans) or ``weighted`` (every cell, a full plan scaled by
            the relevance; no gestalt).
        gestalt: send the gestalt (ARR's grid for K) before the saccades.
        first_look_layers: decoder layers the first look reads (default: the middle half).
        prompts: per image the token ids (before, after) the image, instead of chat-templating ``questions``.
        timings: collects wall milliseconds per stage ("allocation/...", "vision/gestalt", "prefill/gestalt").
    """
    from arr_coc.engine.canvas import make_canvas
    from arr_coc.engine.query import check_queries

    t = {} if timings is None else timings
    patcher = patcher_of(allocator)
    squares = patcher is not None
    if relevance not in RELEVANCE_SOURCES:
        raise ValueError(f"unknown relevance source {relevance!r}; choose one of auto, {', '.join(RELEVANCE_SOURCES)}")
    if squares and encoding != "sparse":
        raise ValueError(f"allocator {allocator!r} sends variable-size patches, which only mode='sparse' encodes "
                         f"(got mode={encoding!r}); use mode='sparse' or allocator='arr'")
    if relevance == "arr" and not squares and allocator != "arr":
        raise ValueError(f"sampler {allocator!r} runs on the first look (relevance 'vlm'); with relevance 'arr' "
                         "ARR samples with its own (ARRConfig(sampler=SamplerConfig(name=...)))")
    arr, k = arr_for(adapter, arr), saccades
    if prompts is None and isinstance(questions, (str, list, tuple)):  # in the VLM's own tokens, before any work
        asked = [questions] if isinstance(questions, str) else list(questions)
        checked = check_queries(asked, len(asked), arr.max_question_tokens, adapter.tokenizer)
        questions = questions if isinstance(questions, str) else checked  # checked once: the stages take it as is
    first: FirstLook | None = None  # the first look, when one runs
    if relevance == "vlm":
        check_first_look(adapter, encoding, gestalt, "relevance 'vlm'")
        cfg = arr.config.canvas
        with timed(t, "allocation/canvas"):  # decoding and resizing the images: every path does it
            canvas = make_canvas(images, cell=adapter.cell, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
            queries = check_queries(questions, canvas.batch_size, arr.max_question_tokens, adapter.tokenizer)
        first = _first_looks(adapter, canvas, queries, prompts, arr, k, first_look_layers, t)
        device = adapter.device
        with timed(t, "allocation/relevance", device):
            rel = first.relevance_map([(h // adapter.cell, w // adapter.cell) for h, w in canvas.sizes],
                                      canvas.grid)  # [B, Hc, Wc]
            valid = canvas.valid.to(device)
        with timed(t, "allocation/selection", device):
            if squares:
                sent = patch_squares(patcher, rel, canvas, k)
            else:
                sent = sample_cells(arr.sampler if allocator == "arr" else allocator, rel, k, valid, arr.config.seed)
        weights = None
    else:
        coupled = None
        if "first_look" in arr.query_channels:
            check_first_look(adapter, encoding, gestalt, "the first_look channel")

            def coupled(canvas: Any, queries: list[str]) -> dict[str, Tensor]:
                nonlocal first
                first = _first_looks(adapter, canvas, queries, prompts, arr, k, first_look_layers, t)
                grids = [(h // adapter.cell, w // adapter.cell) for h, w in canvas.sizes]
                return {"first_look": first.relevance_map(grids, canvas.grid)[:, None]}

        alloc = arr(images, questions, saccades=k, coupled=coupled)
        t.update({f"allocation/{name}": ms for name, ms in alloc.timings_ms.items()})
        canvas, queries = alloc.canvas, alloc.queries
        sent = patch_squares(patcher, alloc.relevance.map, canvas, k) if squares else \
            [alloc.positions[b] for b in range(canvas.batch_size)]
        weights = None
        if encoding == "weighted":
            w = relevance_weights(alloc.relevance.map, canvas.valid)
            weights = [w[b, :h // adapter.cell, :wd // adapter.cell] for b, (h, wd) in enumerate(canvas.sizes)]
    imgs = [canvas.pixels[b, :, :h, :w] for b, (h, w) in enumerate(canvas.sizes)]
    plans = []
    method = allocator if isinstance(allocator, str) else type(allocator).__name__
    for b, (h, w) in enumerate(canvas.sizes):
        grid = (h // adapter.cell, w // adapter.cell)
        # weighted encoding already sends every cell of the image: a gestalt would repeat it
        g = arr.config.gestalt.grid_for(k, grid) if gestalt and encoding != "weighted" else None
        if squares:
            plans.append(Plan(method, "squares", grid, gestalt=g, squares=sent[b]))
        elif encoding == "weighted":
            plans.append(Plan(method, "full", grid, cells=sent[b], encoding="weighted"))
        else:
            plans.append(Plan(method, "cells", grid, gestalt=g, cells=sent[b], encoding=encoding))
    if first is not None:
        prompts = list(zip(first.prefixes, first.suffixes))
    elif prompts is None:
        prompts = [adapter.prompt_ids(q) for q in queries]
    return Planned(plans, imgs, list(queries), [(list(p), list(s)) for p, s in prompts], relevance, first, weights, t)


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
