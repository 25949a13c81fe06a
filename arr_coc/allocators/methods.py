"""The allocation methods: one registry, each method turning one image's inputs and a token count into a Plan.

Every way of placing tokens that ``arr-coc eval`` (both readers), the app and the VLM path offer is an
entry of :data:`METHODS`. A method reads a :class:`MethodInputs` (one image's canvas, the question's
relevance and embedding, the run's samplers, the trained allocators' maps, the VLM's first look, a
seed, options) and a total token count T, and returns a :class:`arr_coc.engine.plan.Plan` (or None where it
has nothing to send at T: a quadtree below its starting tiling, a trained allocator without weights).

Each method declares what it needs instead of callers probing it:

- ``uses_scorer``: its plan depends on the relevance scorer (False: one row per record whatever the scorer);
- ``per_tokens``: one plan per token count (False: one plan, at "full");
- ``source``: the map it reads: ``none``, ``scorer`` (the ARR's relevance), ``edges`` (the image's
  Sobel edges, query-blind), ``learned`` (a trained allocator's own map) or ``vlm`` (the VLM's first
  look, computed by the VLM path and passed in as ``vlm_relevance``: this module never imports it);
- ``readers``: the readers that can send it (``ocr``, ``vlm``): the OCR reader renders pixels and has no
  model to look first or to slice after its encoder;
- ``needs``: what a caller must hand it besides the canvas: ``relevance`` (the ARR's scorer), ``sampler``
  (the ARR's own sampler), ``vlm`` (the VLM's first look), ``weights`` (a trained allocator), ``text`` (the
  pages' text: a ranking or retrieval over it);
- ``scopes``: ``image`` (:meth:`plan`: one image's Plan) and/or ``context`` (:meth:`pages`: a Plan per page
  of a whole context, :mod:`arr_coc.allocators.pages`).

The whole-context methods (``coc``, ``equal_split``, ``first_pages``, ``bm25_pages``, ``retrieval_pages``) are
entries of the same registry; ``full`` and ``uniform_image`` serve both scopes (the context tables call the latter ``uniform``).

``uniform_image`` and ``native_budget`` are one method (the whole image downscaled to at most T
tokens, a ``native`` plan): ``native_budget`` is its alias, kept because rows in existing output
folders and the published VLM tables carry that name (a row keeps the name it was asked by); over a
context it is ``uniform`` (the context tables' name; :func:`resolve`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from arr_coc.allocators.pages import (
    BM25_PAGES,
    COC,
    EQUAL_SPLIT,
    FIRST_PAGES,
    RETRIEVAL_PAGES,
    PagePlans,
    PagesInputs,
    equal_shares,
)
from arr_coc.allocators.patches import BudgetTooSmallError, Patches
from arr_coc.allocators.patching import PATCHERS, edge_density
from arr_coc.budget import Budget
from arr_coc.engine.plan import Plan
from arr_coc.engine.samplers import SAMPLERS, select, topk_cells
from arr_coc.registry import Registry

SOURCES = ("none", "scorer", "edges", "learned", "vlm")


@dataclass
class MethodInputs:
    """What an allocation method may look at for one image (a one-image canvas cropped to ``hc x wc`` cells).

    ``sampler`` is the ARR's configured sampler (the ``arr``, ``slice`` and ``vlm`` methods), called
    with ``sampler_seed`` as ``ARR.forward`` calls it; ``samplers`` holds the run's samplers by name
    (:func:`build_samplers`), called with the record's ``seed``.
    """

    canvas: Any
    relevance: Tensor | None = None  # [1, Hc, Wc] the scorer's map
    query_emb: Tensor | None = None
    sampler: Any = None
    sampler_seed: int = 0
    samplers: dict[str, Any] = field(default_factory=dict)
    maps: dict[str, Tensor] = field(default_factory=dict)  # the trained allocators' own maps [1, Hc, Wc]
    vlm_relevance: Tensor | None = None  # [1, Hc, Wc] the VLM's first look (source "vlm")
    seed: int = 0  # the record's seed (random baseline, stochastic samplers)
    options: dict = field(default_factory=dict)  # keyword options of the patch allocators, e.g. size_prior
    # a request raises where a method has nothing to send (a quadtree below its starting tiling: the error names
    # the K it needs); a sweep over token counts gets None there and leaves that row out
    strict: bool = False
    # the median height (canvas px) of the image's text lines (the text channels' OCR or its text layer; None: not
    # known): where its text stays legible in a larger gestalt, :meth:`Budget.split` gives it one
    text_height: float | None = None

    @property
    def cell(self) -> int:
        return self.canvas.cell

    @property
    def grid(self) -> tuple[int, int]:
        """(hc, wc): the image's own token cells."""
        return self.canvas.sizes[0][0] // self.cell, self.canvas.sizes[0][1] // self.cell

    def split(self, tokens: int) -> tuple[tuple[int, int], int]:
        """(gestalt grid, saccades K) of a total of ``tokens``."""
        gestalts, k = Budget.parse(tokens).split([self.grid], text_height=self.text_height)
        return gestalts[0], k


class Method(Protocol):
    """An allocation method; see the module docstring for what its attributes declare."""

    uses_scorer: bool
    per_tokens: bool
    source: str
    readers: tuple[str, ...]
    needs: tuple[str, ...]
    scopes: tuple[str, ...]

    def plan(self, name: str, inputs: MethodInputs, tokens: int) -> Plan | None: ...


BOTH = ("ocr", "vlm")


@dataclass(frozen=True)
class FullResolution:
    """The upper bound: every cell at full resolution (over a context: every page)."""

    uses_scorer: bool = False
    per_tokens: bool = False
    source: str = "none"
    readers: tuple[str, ...] = BOTH
    needs: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ("image", "context")
    context_readers: tuple[str, ...] = ("ocr",)  # over a context only the OCR readers render its pages

    def plan(self, name: str, inputs: MethodInputs, tokens: int) -> Plan:
        return Plan(name, "full", inputs.grid)

    def pages(self, name: str, inputs: PagesInputs, total: int) -> PagePlans:
        return {i: Plan(name, "full", tuple(g)) for i, g in enumerate(inputs.grids)}


@dataclass(frozen=True)
class NativeDownscale:
    """The field's baseline: the whole image downscaled to at most the token count (over a context: every
    page downscaled to an equal share of it)."""

    uses_scorer: bool = False
    per_tokens: bool = True
    source: str = "none"
    readers: tuple[str, ...] = BOTH
    needs: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ("image", "context")
    context_readers: tuple[str, ...] = ("ocr",)  # over a context only the OCR readers render its pages

    def plan(self, name: str, inputs: MethodInputs, tokens: int) -> Plan:
        return Plan(name, "native", inputs.grid, native=tokens)

    def pages(self, name: str, inputs: PagesInputs, total: int) -> PagePlans:
        shares = equal_shares(total, len(inputs.grids))
        return {i: Plan(name, "native", tuple(g), native=shares[i]) for i, g in enumerate(inputs.grids)}


def _cells_plan(name: str, inputs: MethodInputs, grid: tuple[int, int], sel: Any, encoding: str = "sparse") -> Plan:
    return Plan(name, "cells", inputs.grid, gestalt=grid, cells=sel.positions[0], scores=sel.scores[0],
                encoding=encoding)


@dataclass(frozen=True)
class SamplerMethod:
    """Gestalt + K one-cell saccades from a sampler of :data:`arr_coc.engine.samplers.SAMPLERS` on a map.

    ``sampler`` None: the ARR's configured sampler, seeded as ``ARR.forward`` seeds it (what ``look``,
    ``ask`` and ``ARR()`` send); a name: that sampler of the run, seeded per record. ``encoding``
    ``slice``: the VLM encodes the whole image and keeps the chosen tokens (pruning after the encoder).
    ``source`` ``edges``: the map is the image's Sobel edge density, no question (``topk_edges``: the
    saccades go to the densest text of a page, the question-free allocation of page reading).
    """

    sampler: str | None = None
    uses_scorer: bool = True
    per_tokens: bool = True
    source: str = "scorer"
    readers: tuple[str, ...] = BOTH
    encoding: str = "sparse"
    scopes: tuple[str, ...] = ("image",)

    @property
    def needs(self) -> tuple[str, ...]:
        return {"scorer": ("relevance",), "vlm": ("vlm",), "edges": ()}[self.source] + \
            (("sampler",) if self.sampler is None else ())

    def plan(self, name: str, inputs: MethodInputs, tokens: int) -> Plan | None:
        grid, k = inputs.split(tokens)
        if self.source == "edges":  # query-blind: the image's own edge density (text density on a page)
            relevance = edge_density(inputs.canvas.pixels, inputs.cell)
        else:
            relevance = inputs.vlm_relevance if self.source == "vlm" else inputs.relevance
        if relevance is None:
            raise ValueError(f"method {name!r} reads the {self.source} relevance, which was not passed in")
        if self.sampler is None:
            if inputs.sampler is None:
                return None
            sel = select(inputs.sampler, relevance, k, valid=inputs.canvas.valid, query_emb=inputs.query_emb,
                         seed=inputs.sampler_seed)
        else:
            sel = select(inputs.samplers[self.sampler], relevance, k, valid=inputs.canvas.valid,
                         query_emb=inputs.query_emb, seed=inputs.seed)
        return _cells_plan(name, inputs, grid, sel, self.encoding)


@dataclass(frozen=True)
class LearnedMethod:
    """Gestalt + the top K cells of a trained allocator's own map (arr_coc.allocators.pruning)."""

    name: str
    uses_scorer: bool = True
    per_tokens: bool = True
    source: str = "learned"
    readers: tuple[str, ...] = BOTH
    needs: tuple[str, ...] = ("weights",)
    scopes: tuple[str, ...] = ("image",)

    def plan(self, name: str, inputs: MethodInputs, tokens: int) -> Plan | None:
        if self.name not in inputs.maps:
            return None
        grid, k = inputs.split(tokens)
        return _cells_plan(name, inputs, grid, topk_cells(inputs.maps[self.name], k, inputs.canvas.valid))


@dataclass(frozen=True)
class SquaresMethod:
    """Gestalt + variable-size squares from a patcher of :data:`arr_coc.allocators.patching.PATCHERS`,
    driven by the query's relevance (source ``scorer``) or the image's Sobel edges (``edges``, query-blind)."""

    patcher: str
    source: str = "scorer"
    uses_scorer: bool = True
    per_tokens: bool = True
    readers: tuple[str, ...] = BOTH
    scopes: tuple[str, ...] = ("image",)

    @property
    def needs(self) -> tuple[str, ...]:
        return ("relevance",) if self.source == "scorer" else ()

    def plan(self, name: str, inputs: MethodInputs, tokens: int) -> Plan | None:
        grid, k = inputs.split(tokens)
        canvas = inputs.canvas
        saliency = inputs.relevance if self.source == "scorer" else edge_density(canvas.pixels, canvas.cell)
        patcher = PATCHERS.get(self.patcher)
        accepted = inspect.signature(patcher).parameters  # e.g. size_prior reaches the square patches only
        try:
            patches = patcher(saliency.detach(), k, valid=canvas.valid, pixels=canvas.pixels,
                              **{key: v for key, v in inputs.options.items() if key in accepted})
        except BudgetTooSmallError:  # a quadtree cannot start below its first tiling: nothing to send
            if inputs.strict:
                raise
            return None
        n = int(patches.counts[0])
        return Plan(name, "squares", inputs.grid, gestalt=grid, squares=patches.boxes[0][:n],
                    scores=patches.scores[0][:n])


# Every method, in table order: the upper bound, the whole-context methods, the field's baseline, then the
# allocators (each reader's list keeps this order: the context table reads full, coc, equal_split, uniform, ...).
METHODS: Registry[Method] = Registry("allocation method")
for _name, _method in (
        ("full", FullResolution()), ("coc", COC), ("equal_split", EQUAL_SPLIT),
        ("uniform_image", NativeDownscale()), ("native_budget", NativeDownscale()),
        ("first_pages", FIRST_PAGES), ("bm25_pages", BM25_PAGES), ("retrieval_pages", RETRIEVAL_PAGES),
        ("random", SamplerMethod("random", uses_scorer=False)), ("topk", SamplerMethod("topk")),
        ("arr", SamplerMethod()), ("vlm", SamplerMethod(source="vlm", uses_scorer=False, readers=("vlm",))),
        ("slice", SamplerMethod(encoding="slice", readers=("vlm",))),
        ("uniform", SamplerMethod("uniform", uses_scorer=False)), ("nms", SamplerMethod("nms")), ("stratified", SamplerMethod("stratified")),
        ("adaptive_stratified", SamplerMethod("adaptive_stratified")), ("log_polar", SamplerMethod("log_polar")),
        ("patches", SquaresMethod("saliency")), ("patches_edges", SquaresMethod("saliency", "edges")),
        ("quadtree", SquaresMethod("quadtree")),
        ("topk_edges", SamplerMethod("topk", uses_scorer=False, source="edges")),
        ("selector", LearnedMethod("selector")),
        ("pruner", LearnedMethod("pruner"))):
    METHODS.register(_name)(_method)
# the names a reader's rows carry for one entry (a row keeps the name it was asked by): the VLM tables call the
# native downscale native_budget, the context tables uniform; the OCR tables of images uniform_image
ALIASES = {"native_budget": "uniform_image"}
SCOPE_NAMES = {"context": {"uniform": "uniform_image"}}  # over a context, "uniform" is the native downscale
# evenly spaced saccades and the edge-density top-K (page reading's question-free allocation): asked for by
# name, but not in the readers' default lists (the published tables were made without them)
NOT_DEFAULT = ("uniform", "topk_edges")
# trained allocators (arr_coc.allocators.pruning): top-K of their own map
LEARNED_METHODS = tuple(n for n in METHODS.names() if isinstance(METHODS.get(n), LearnedMethod))
SCORER_FREE = tuple(n for n in METHODS.names() if not METHODS.get(n).uses_scorer and METHODS.get(n).source == "none"
                    and "image" in METHODS.get(n).scopes)


def resolve(name: str, scope: str = "image") -> Method:
    """The registry entry a name means in ``scope`` (``image`` or ``context``): over a context ``uniform`` is the
    native downscale of every page (the context tables' name), not the evenly spaced saccades.

    >>> resolve("uniform", "context") is METHODS.get("uniform_image"), resolve("uniform") is METHODS.get("uniform")
    (True, True)
    """
    entry = METHODS.get(SCOPE_NAMES.get(scope, {}).get(name, name))
    if scope not in entry.scopes:
        raise ValueError(f"method {name!r} does not send a whole {scope}; choose one of "
                         f"{', '.join(methods_for('ocr', scope=scope))}")
    return entry


def methods_for(reader: str, default: bool = False, scope: str = "image") -> tuple[str, ...]:
    """The methods a reader (``ocr`` or ``vlm``) can send over one image or a whole context (``scope``), in table
    order, under the reader's own names; ``default``: only those its default method list holds.

    >>> methods_for("ocr")[:5], methods_for("vlm")[:6]
    (('full', 'uniform_image', 'random', 'topk', 'arr'), ('full', 'native_budget', 'random', 'topk', 'arr', 'vlm'))
    >>> "uniform" in methods_for("ocr"), "uniform" in methods_for("ocr", default=True)
    (True, False)
    >>> methods_for("ocr", scope="context"), methods_for("vlm", scope="context")
    (('full', 'coc', 'equal_split', 'uniform', 'first_pages', 'bm25_pages', 'retrieval_pages'), ('coc',))
    """
    if scope == "context":
        named = {v: k for k, v in SCOPE_NAMES["context"].items()}
        return tuple(named.get(n, n) for n in METHODS.names() if scope in METHODS.get(n).scopes
                     and reader in getattr(METHODS.get(n), "context_readers", METHODS.get(n).readers)
                     and n not in ALIASES)
    other_name = tuple(ALIASES) if reader == "ocr" else tuple(ALIASES.values())
    return tuple(n for n in METHODS.names() if reader in METHODS.get(n).readers and n not in other_name
                 and scope in METHODS.get(n).scopes and not (default and n in NOT_DEFAULT))


def build_samplers(names: Any) -> dict[str, Any]:
    """The named samplers the methods ``names`` call, built once for a run (their seeds come per record)."""
    wanted = [METHODS.get(n).sampler for n in names if n in METHODS and isinstance(METHODS.get(n), SamplerMethod)]
    return {s: SAMPLERS.get(s)() for s in dict.fromkeys(wanted) if s is not None}


def make_plan(name: str, inputs: MethodInputs, tokens: int) -> Plan | None:
    """Method ``name``'s plan for one image at ``tokens`` total tokens (None: nothing to send there)."""
    return METHODS.get(name).plan(name, inputs, tokens)


def page_plans(name: str, inputs: PagesInputs, total: int) -> PagePlans:
    """Method ``name``'s plans {page position: Plan} over a whole context at T = ``total`` (a page it sends nothing
    of has none); ``name`` as the context tables spell it (:func:`resolve`)."""
    return resolve(name, "context").pages(name, inputs, total)


def cell_mask(plan: Plan) -> Tensor:
    """The plan's full-resolution cells as a bool map [hc, wc] (cells: the saccades; squares: the 1x1 squares)."""
    hc, wc = plan.grid
    out = torch.zeros(hc * wc, dtype=torch.bool)
    if plan.kind == "cells":
        out[plan.cells[:, 0] * wc + plan.cells[:, 1]] = True
    elif plan.kind == "squares":
        return square_sizes(plan) == 1
    elif plan.kind == "full":
        out[:] = True
    return out.view(hc, wc)


def square_sizes(plan: Plan) -> Tensor:
    """[hc, wc] int64: the side of the square covering each cell of a squares plan, 0 where none does."""
    return Patches(plan.squares[None], torch.zeros(1, len(plan.squares))).mask(*plan.grid)[0]
