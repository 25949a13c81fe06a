"""The VLM path's allocation stage: one :class:`arr_coc.engine.plan.Plan` per image, from the one allocator and the
method registry.

* relevance ``"arr"``: every image is a one-page context allocated by :func:`arr_coc.contexts.allocate_images`
  (the context allocation's own code, the batch seen and scored in one ARR pass; with ARR's ``first_look``
  channel the VLM's first look feeds that scorer); the page's plan is the ``arr`` allocator's;
* relevance ``"vlm"``: the VLM's first look at each image's gestalt (:func:`read_first_look`) is the relevance,
  and the registry's ``vlm`` method places the saccades on it (:data:`arr_coc.allocators.methods.METHODS`);
* any other allocator (``"patches"``, ``"quadtree"``; on the first look also a sampler's name) is the registry's
  method of that name (``Method.plan``) on the image's relevance;
* the request's encoding and gestalt then shape what is sent: ``slice`` (the whole grid encoded, the saccades
  kept), ``weighted`` (every cell, scaled by relevance: :func:`relevance_weights`), no gestalt.

The gestalt of every plan is the budget's split of its page (:func:`arr_coc.contexts.plan_budget`), as over a
context.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

from arr_coc.allocators.methods import METHODS, MethodInputs, SamplerMethod, SquaresMethod
from arr_coc.allocators.patches import BudgetTooSmallError
from arr_coc.budget import Budget
from arr_coc.config import ARRConfig
from arr_coc.contexts import allocate_images, plan_budget
from arr_coc.engine.canvas import Canvas, make_canvas
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import check_queries
from arr_coc.engine.samplers import SAMPLERS
from arr_coc.engine.selection import shift_nonnegative
from arr_coc.threads import check_model
from arr_coc.vlm.first_look import FirstLook, first_look
from arr_coc.vlm.generation import timed
from arr_coc.vlm.processing import VisualTokens
from arr_coc.vlm.protocol import FIRST_LOOK, VLMAdapter

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
                    prompts: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
                    layers: Sequence[int] | None = None, timings: dict[str, float] | None = None) -> FirstLook:
    """The VLM's first look: each image's gestalt (``gestalts[b]`` grid) encoded alone, then the question read
    over it (:func:`arr_coc.vlm.first_look.first_look`; ``prompts`` instead of chat-templated ``questions``).

    Its ``cell_maps`` are the relevance; its ``gestalt`` tokens and cache serve
    :func:`arr_coc.vlm.stages.encode` and :func:`arr_coc.vlm.stages.prefill`.
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


def image_list(images: Any) -> list[Any]:
    """One image (a path, a PIL image, a [3, H, W] tensor), a [B, 3, H, W] tensor or a list: a list of images."""
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        return list(images)
    return list(images) if isinstance(images, (list, tuple)) else [images]


def method_of(allocator: str, relevance: str) -> str:
    """The registry method that places a request's saccades: ``allocator``, the ARR's own sampler being ``arr`` on
    the scorer's relevance and ``vlm`` on the first look.

    >>> method_of("arr", "arr"), method_of("arr", "vlm"), method_of("quadtree", "vlm")
    ('arr', 'vlm', 'quadtree')
    """
    return "vlm" if allocator == "arr" and relevance == "vlm" else allocator


def check_allocator(allocator: str, relevance: str, encoding: str) -> None:
    """Refuse, in one line, an allocator the request cannot use with this relevance and encoding."""
    if relevance not in RELEVANCE_SOURCES:
        raise ValueError(f"unknown relevance source {relevance!r}; choose one of auto, {', '.join(RELEVANCE_SOURCES)}")
    squares = allocator in allocators() and allocator != "arr"
    if squares and encoding != "sparse":
        raise ValueError(f"allocator {allocator!r} sends variable-size patches, which only mode='sparse' encodes "
                         f"(got mode={encoding!r}); use mode='sparse' or allocator='arr'")
    if not squares and allocator != "arr":
        if relevance == "arr":
            raise ValueError(f"sampler {allocator!r} runs on the first look (relevance 'vlm'); with relevance 'arr' "
                             "ARR samples with its own (ARRConfig(sampler=SamplerConfig(name=...)))")
        SAMPLERS.get(allocator)  # an unknown name lists the samplers


def method_plan(name: str, image: Tensor, relevance: Tensor, budget: Budget, arr: ARR, cell: int) -> Plan:
    """Registry method ``name``'s plan for one image [3, H, W] on its relevance [hc, wc] (the ARR's sampler and
    seed for ``arr`` / ``vlm``; a sampler's name runs that sampler with the ARR's seed)."""
    h, w = image.shape[-2:]
    device = relevance.device
    canvas = Canvas(image[None].to(device), torch.ones(1, h // cell, w // cell, dtype=torch.bool, device=device),
                    [(h, w)], [(h, w)], cell)
    inputs = MethodInputs(canvas, relevance[None], sampler=arr.sampler, sampler_seed=arr.config.seed,
                          samplers={name: SAMPLERS.get(name)()} if name in SAMPLERS else {},
                          vlm_relevance=relevance[None], seed=arr.config.seed, strict=True)
    try:
        return METHODS.get(name).plan(name, inputs, budget)
    except BudgetTooSmallError as err:  # a quadtree cannot start below its first tiling
        raise BudgetTooSmallError(f"allocator {name!r} needs more saccades: {err}; raise --saccades (saccades=) "
                                  f"to at least {err.minimum}", err.k, err.minimum) from err


def as_sent(plan: Plan, gestalt: tuple[int, int] | None, encoding: str) -> Plan:
    """The plan as the request sends it: the page's gestalt (None: none) and the encoding of its cells."""
    if encoding == "weighted":  # every cell of the image is sent: a gestalt would repeat it
        return Plan(plan.method, "full", plan.grid, cells=plan.cells, encoding="weighted")
    return replace(plan, gestalt=gestalt, encoding=encoding)


def allocate(adapter: VLMAdapter, images: Any, questions: str | Sequence[str], *, saccades: int | None = None,
             budget: Budget | None = None, arr: ARR | None = None, relevance: str = "arr", allocator: str = "arr",
             encoding: str = "sparse", gestalt: bool = True, first_look_layers: Sequence[int] | None = None,
             prompts: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
             timings: dict[str, float] | None = None) -> Planned:
    """One :class:`arr_coc.engine.plan.Plan` per image: where the saccades go, and the gestalt sent before them.

    Args:
        adapter: the VLM (its cell is the canvas cell).
        images, questions: one image or a list (or a [B, 3, H, W] tensor), one question per image (one: for all).
        saccades: K per image (a patch allocator: at most K squares); default the ARR's.
        budget: instead of ``saccades``, a :class:`arr_coc.budget.Budget` for each image (a total is split by
            the context rule on its one page).
        arr: an ARR on the adapter's cell (:func:`arr_for`); its canvas, gestalt rule and seed serve
            both relevance sources, its sampler the ``arr`` one.
        relevance: ``"arr"``: ARR's scorer, each image a one-page context (the VLM's first look feeds it when ARR
            has the ``first_look`` channel); ``"vlm"``: the VLM's first look alone.
        allocator: ``"arr"``, one-cell saccades from ARR's sampler; a method of :func:`allocators`
            (``"patches"``, ``"quadtree"``: variable-size squares on the relevance); on the first look also a
            SAMPLERS name (that sampler on it).
        encoding: ``sparse``, ``slice`` (cells plans) or ``weighted`` (every cell, a full plan scaled by
            the relevance; no gestalt).
        gestalt: send the gestalt before the saccades.
        first_look_layers: decoder layers the first look reads (default: the middle half).
        prompts: per image the token ids (before, after) the image, instead of chat-templating ``questions``.
        timings: collects wall milliseconds per stage ("allocation/...", "vision/gestalt", "prefill/gestalt").
    """
    t = {} if timings is None else timings
    check_allocator(allocator, relevance, encoding)
    arr = arr_for(adapter, arr)
    if budget is None:
        budget = Budget.saccades(arr.config.sampler.saccades if saccades is None else saccades)
    elif saccades is not None:
        raise ValueError("give saccades (K) or budget (a total), not both")
    images = image_list(images)
    # in the VLM's own tokens, before any work: the stages take the checked questions as they are
    queries = check_queries(questions, len(images), arr.max_question_tokens, adapter.tokenizer)
    cell, first = adapter.cell, None

    def look(canvas: Canvas, qs: Sequence[str]) -> FirstLook:
        """The first look at every image of a canvas, on each page's gestalt by the budget's split."""
        grids = [(h // cell, w // cell) for h, w in canvas.sizes]
        pixels = [canvas.pixels[b, :, :h, :w] for b, (h, w) in enumerate(canvas.sizes)]
        return read_first_look(adapter, pixels, [plan_budget(arr.config, budget, [g])[0][0] for g in grids], qs,
                               prompts=prompts, layers=first_look_layers, timings=t)

    if relevance == "vlm":
        check_first_look(adapter, encoding, gestalt, "relevance 'vlm'")
        cfg = arr.config.canvas
        with timed(t, "allocation/canvas"):  # decoding and resizing the images: every path does it
            canvas = make_canvas(images, cell=cell, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
        first = look(canvas, queries)
        pixels = [canvas.pixels[b, :, :h, :w] for b, (h, w) in enumerate(canvas.sizes)]
        with timed(t, "allocation/relevance", adapter.device):
            maps = first.cell_maps([(h // cell, w // cell) for h, w in canvas.sizes])  # per image [hc, wc]
        placed: list[Plan | None] = [None] * len(images)
        gestalts = [plan_budget(arr.config, budget, [tuple(m.shape)])[0][0] for m in maps]
    else:
        coupled = None
        if "first_look" in arr.query_channels:
            check_first_look(adapter, encoding, gestalt, "the first_look channel")

            def coupled(canvas: Canvas, qs: list[str]) -> dict[str, Tensor]:
                nonlocal first
                first = look(canvas, qs)
                grids = [(h // cell, w // cell) for h, w in canvas.sizes]
                return {"first_look": first.relevance_map(grids, canvas.grid)[:, None]}

        allocs = allocate_images(arr, images, queries, budget, coupled=coupled)
        t.update({f"allocation/{name}": ms for name, ms in allocs[0].timings_ms.items()})
        pages = [a.pages[0] for a in allocs]
        pixels, maps = [p.image for p in pages], [p.placing for p in pages]  # a wordless page's placing: its relevance
        placed, gestalts = [p.plan for p in pages], [p.plan.gestalt for p in pages]
    name = method_of(allocator, relevance)
    with timed(t, "allocation/selection", adapter.device):
        plans = [as_sent(plan if plan is not None and name == "arr" else
                         method_plan(name, img, rel, budget, arr, cell), g if gestalt else None, encoding)
                 for plan, img, rel, g in zip(placed, pixels, maps, gestalts)]
    weights = None
    if encoding == "weighted":
        weights = [relevance_weights(m[None], torch.ones_like(m, dtype=torch.bool)[None])[0] for m in maps]
    if first is not None:
        prompts = list(zip(first.prefixes, first.suffixes))
    elif prompts is None:
        prompts = [adapter.prompt_ids(q) for q in queries]
    return Planned(plans, pixels, list(queries), [(list(p), list(s)) for p, s in prompts], relevance, first, weights, t)
