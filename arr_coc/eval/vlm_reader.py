"""The VLM as reader: every method at every token budget answered by the frozen model itself, scored by the
benchmark's own metric, with what each answer cost.

The VLM reader of the evaluation loop (:func:`arr_coc.eval.evaluate.evaluate`). Methods (``VLM_METHODS``: the
entries of :mod:`arr_coc.allocators.methods` the VLM reader can send), each
making a :class:`arr_coc.engine.plan.Plan` that the adapters ``arr-coc ask`` uses encode:

- ``full``: the model's own image processor at its native resolution (capped at the canvas's
  ``max_pixels``), every token sent: the upper bound.
- ``native_budget`` (alias of the OCR table's ``uniform_image``): the same processor with ``max_pixels``
  set so the image has at most the budget's tokens: the model's own downscaling, the baseline to beat.
- ``arr``: gestalt + saccades from the ARR's sampler and scorer, the tower encoding only them (sparse).
- ``vlm``: the same sampler on the model's own first look (:mod:`arr_coc.vlm.first_look`: the question's
  attention to the gestalt tokens, spread over the cells); the gestalt encoded for the look is reused.
- ``slice``: the same cells, but the tower encodes the whole image and the chosen tokens are kept
  (pruning after the encoder).
- every sampler by name (``topk``, ``stratified``, ``random``, ...), the variable-size patch
  allocators (``patches``, ``patches_edges``, ``quadtree``) and the trained ``selector`` / ``pruner``.

A token spec T is a number of visual tokens (``529``) or a share of the full-resolution canvas (``25%``),
kept as asked in the row's ``budget`` column.
Per answer a row records the tokens sent, the allocation time (texture of the image + scoring +
selection; ``vlm``: the gestalt's encoding and the first look; ``full`` and ``native_budget`` allocate
nothing), the vision tower's time, the prefill and decode time (batched: the batch's time shared
equally among its answers), and the estimated FLOPs of the model's work (vision + LLM prefill +
decode, plus the first look for ``vlm``; the texture and OCR of ``arr`` run outside the model and
show in the allocation time only).

At scale: answers are generated ``batch_size`` at a time. Under ``torchrun --nproc_per_node N`` every
rank takes every N-th image (gloo on CPU, nccl on GPU) and appends its rows to the folder's
``records.jsonl`` (the loop's store: locked, a key never written twice). A rerun, with any number of
processes, skips every (record, method, budget) already there, so nothing is answered twice and a rank that
died loses at most the batch it was answering; a folder made with other settings (model, prompt, ...) is
refused. Tables and plots: :func:`arr_coc.eval.report.write_reports`.

Multi-page records (``Record.pages``: :mod:`arr_coc.data.mpdocvqa`, :mod:`arr_coc.data.slidevqa`) are read
by :func:`answer_pages`: method ``coc`` (the context allocation, :func:`arr_coc.contexts.allocate`)
at T tokens over all the record's pages, one multi-image prompt.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import torch
from PIL import Image

from arr_coc.allocators.methods import MethodInputs, build_samplers, make_plan, methods_for
from arr_coc.contexts.allocate import image_placing
from arr_coc.data.datasets import Record
from arr_coc.engine.channels.text import text_heights
from arr_coc.engine.plan import Plan
from arr_coc.eval.evaluate import Unit, row
from arr_coc.eval.metrics import answer_score
from arr_coc.eval.run import learned_maps, placing_settings, record_seed
from arr_coc.eval.settings import PROMPT, VLM_DEFAULT_METHODS, EvalSettings
from arr_coc.threads import check_model
from arr_coc.vlm import encode as encode_plans
from arr_coc.vlm.allocation import read_first_look
from arr_coc.vlm.cost import decode_flops, prefill_flops
from arr_coc.vlm.generation import answer_text, generate, synchronize
from arr_coc.vlm.processing import assemble
from arr_coc.vlm.protocol import PROCESSOR
from arr_coc.weights import load_learned_methods

VLM_METHODS = methods_for("vlm")  # in table order
DEFAULT_METHODS = VLM_DEFAULT_METHODS
__all__ = ["PROMPT", "VLM_METHODS", "DEFAULT_METHODS", "VLMAnswers", "answer_jobs", "answer_pages"]


@dataclass
class Job:
    """One (record, method, budget) encoded and waiting for its answer."""

    record: Record
    method: str
    budget: str
    visual: Any  # VisualTokens
    full_tokens: int
    alloc_ms: float
    vision_ms: float
    flops_alloc: float = 0.0  # the model's own work spent choosing (the vlm source's first look)


def run_identity(arr: Any, adapter: Any, settings: EvalSettings) -> dict:
    """What the answers depend on besides the record, method and budget: a resumed run must match it."""
    return {"model": settings.model, "dtype": str(adapter.visual.dtype).replace("torch.", ""),
            "prompt": settings.prompt, "max_new_tokens": settings.max_new_tokens, "layout": settings.layout,
            "seed": settings.seed, "channels": list(arr.channels), "scorer": arr.config.scorer.name,
            "scorer_weights": arr.weights_source, "sampler": arr.config.sampler.name,
            "max_pixels": arr.config.canvas.max_pixels, "patch_options": settings.patch_options or {},
            "learned": settings.learned or {}, **placing_settings(arr)}


class VLMAnswers:
    """The loop's VLM reader: images (every method planned and encoded, answered ``batch_size`` at a time) and
    multi-page records (:func:`answer_pages`, one prompt over their pages). Under torchrun it takes its share.

    Raises:
        ValueError: the ARR's cell is not the model's, or the model cannot do what a method asks.
        ThreadLimitError: a bfloat16 / float16 model on the CPU under an ``OMP_THREAD_LIMIT`` below torch's threads.
    """

    shards = True
    desc = " (vlm)"

    def __init__(self, arr: Any, adapter: Any, settings: EvalSettings) -> None:
        check_model(adapter, "eval with the VLM reader")  # before any record: a half-precision model under OMP_THREAD_LIMIT
        if arr.config.canvas.cell != adapter.cell:
            raise ValueError(f"the ARR canvas cell is {arr.config.canvas.cell} px but {adapter.name} needs "
                             f"{adapter.cell} px")
        if "vlm" in settings.methods:  # refused before any record is allocated, in ask's words
            adapter.require("first_look", "method 'vlm' (the VLM's first look)")
        if {"full", "native_budget"} & set(settings.methods) and PROCESSOR not in adapter.capabilities:
            raise ValueError(f"{adapter.name} has no image processor of its own to resize with; "
                             f"leave out full and native_budget")
        self.arr, self.adapter, self.settings = arr, adapter, settings
        self.learned = load_learned_methods(arr, settings) if {"selector", "pruner"} & set(settings.methods) else {}
        self.samplers = build_samplers(settings.methods)
        self.batch: list[Job] = []

    def identity(self) -> tuple[dict, dict]:
        return run_identity(self.arr, self.adapter, self.settings), {}

    def rows(self, unit: Unit, todo: list, done: set) -> Iterator[list[dict]]:
        s = self.settings
        if s.scope == "context":  # multi-page records: one prompt over their pages, seen once per set of pages
            from arr_coc.contexts import see_context

            seen: dict[tuple, Any] = {}
            for r in todo:
                pages = tuple(str(p) for p in r.pages)
                with torch.no_grad():
                    if pages not in seen:
                        seen = {pages: see_context(self.arr, list(pages))}
                yield [answer_pages(r, self.arr, self.adapter, s, b, seen[pages]) for m, b in s.wanted()
                       if (r.record_id, m, b) not in done]
            return
        for job in _jobs(todo, self.arr, self.adapter, s, self.learned, self.samplers, done):
            self.batch.append(job)
            if len(self.batch) == s.batch_size:
                yield answer_jobs(self.batch, self.adapter, s)
                self.batch.clear()

    def flush(self) -> list[dict]:
        rows = answer_jobs(self.batch, self.adapter, self.settings) if self.batch else []
        self.batch.clear()
        return rows


# ----------------------------------------------------------------------------- encoding and answering
def _timed_encode(adapter: Any, fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    synchronize(adapter.visual.device)
    return out[0], (time.perf_counter() - start) * 1e3


def _jobs(recs: Sequence[Record], arr: Any, adapter: Any, settings: EvalSettings, learned: dict,
          samplers: dict, done: set) -> Iterator[Job]:
    """Every pending (record, method, budget) of one image, planned and encoded; the texture is computed once."""
    todo = {r.record_id: [(m, b) for m, b in settings.wanted() if (r.record_id, m, b) not in done]
            for r in recs}
    if not any(todo.values()):
        return
    budgets = settings.parsed()
    start = time.perf_counter()
    with torch.no_grad():
        scene = arr.see(recs[0].image)
        vector = arr.gestalt(scene, 1).vector
    texture_ms = (time.perf_counter() - start) * 1e3
    canvas, cell = scene.canvas, adapter.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    pixels, full = canvas.pixels[0, :, : hc * cell, : wc * cell], canvas.full_tokens[0]
    photo, heights = None, None
    for record in recs:
        if not todo[record.record_id]:
            continue
        start = time.perf_counter()
        with torch.no_grad():
            relevance, query_emb = arr.score(scene, [record.question], vector)
            maps = learned_maps(learned, arr, scene, record.question, query_emb) if learned else {}
            if heights is None:  # once: the image's lines as the text channels read them scoring it
                heights = text_heights(arr, scene)
            placing = image_placing(arr, scene, relevance.map, record.question)  # as allocate places one image
        score_ms = (time.perf_counter() - start) * 1e3
        inputs = MethodInputs(canvas, placing.detach(), query_emb, sampler=arr.sampler,
                              sampler_seed=arr.config.seed, samplers=samplers, maps=maps,
                              seed=record_seed(settings.seed, record.record_id), options=settings.patch_options or {},
                              text_height=heights[0])
        for method, spec in todo[record.record_id]:
            total = full if spec == "full" else budgets[spec].total(full)
            if method == "vlm":
                yield _first_look_job(record, spec, adapter, settings, inputs, total, pixels, full)
                continue
            start = time.perf_counter()
            with torch.no_grad():
                plan = make_plan(method, inputs, total)
            if plan is None:  # e.g. a quadtree below its starting tiling: no row, as in the OCR table
                continue
            if plan.kind in ("full", "native"):  # the model's own processor: nothing to allocate
                if photo is None:
                    with Image.open(record.image) as im:
                        photo = im.convert("RGB")
                if plan.kind == "full":  # every token the processor gives the photo within the canvas's cap
                    plan = Plan(method, "native", plan.grid, native=arr.config.canvas.max_tokens)
                visual, vision_ms = _timed_encode(adapter, encode_plans, adapter, [plan], [pixels], sources=[photo])
                yield Job(record, method, spec, visual, full, 0.0, vision_ms)
                continue
            select_ms = (time.perf_counter() - start) * 1e3
            visual, vision_ms = _encode_plan(adapter, plan, pixels, settings.layout)
            yield Job(record, method, spec, visual, full, texture_ms + score_ms + select_ms, vision_ms)


def _encode_plan(adapter: Any, plan: Plan, pixels: Any, layout: str, **kwargs: Any) -> tuple[Any, float]:
    """A cells or squares plan through the staged path's encoder (:func:`arr_coc.vlm.encode`): (tokens, ms)."""
    return _timed_encode(adapter, encode_plans, adapter, [plan], [pixels], layout=layout, **kwargs)


def _first_look_job(record: Record, spec: str, adapter: Any, settings: EvalSettings, inputs: MethodInputs,
                    total: int, pixels: Any, full: int) -> Job:
    """The ``vlm`` method: the staged path's first look (:func:`arr_coc.vlm.allocation.read_first_look`: the gestalt encoded,
    the question's attention to it read) is the relevance ARR's sampler spends the saccades on (the registry's
    ``vlm`` method, through :func:`arr_coc.engine.samplers.select`); the gestalt tokens are reused for the answer."""
    (grid, _) = inputs.split(total)
    start = time.perf_counter()
    look = read_first_look(adapter, [pixels], [grid], [settings.prompt.format(question=record.question)])
    # a one-image canvas has no padding: the map covers every valid cell; the methods run on the CPU
    relevance = look.relevance_map([inputs.grid], inputs.canvas.grid).float().cpu()
    with torch.no_grad():
        plan = make_plan("vlm", replace(inputs, vlm_relevance=relevance), total)
    synchronize(adapter.visual.device)
    alloc_ms = (time.perf_counter() - start) * 1e3
    seen = look.gestalt[0]
    looked = prefill_flops(adapter, len(look.prefixes[0]) + len(seen) + len(look.suffixes[0]),
                           seen.vision_segments)["total"]
    visual, vision_ms = _encode_plan(adapter, plan, pixels, settings.layout, encoded=look.gestalt)
    return Job(record, "vlm", spec, visual, full, alloc_ms, vision_ms, looked)


def answer_jobs(jobs: Sequence[Job], adapter: Any, settings: EvalSettings) -> list[dict]:
    """Generate the answers of ``jobs`` as one batch and score them: one row per job."""
    prompts = [adapter.prompt_ids(settings.prompt.format(question=j.record.question)) for j in jobs]
    prefill = assemble(adapter.embed_tokens, [p[0] for p in prompts], [j.visual for j in jobs],
                       [p[1] for p in prompts], adapter.rope_rows)
    times: dict[str, float] = {}
    tokens, _ = generate(adapter, prefill, max_new_tokens=settings.max_new_tokens, logits=False,  # greedy
                         timings=times)
    rows, n = [], len(jobs)
    for job, (pre, suf), generated in zip(jobs, prompts, tokens.tolist()):
        text, ids = answer_text(adapter, generated)
        steps = min(len(ids) + 1, len(generated))  # the end-of-sequence step is decoded too
        prompt = len(pre) + len(job.visual) + len(suf)
        pf, df = prefill_flops(adapter, prompt, job.visual.vision_segments), decode_flops(adapter, prompt, steps)
        r = job.record
        rows.append(row(
            r.dataset, r.record_id, r.image_id, r.kind, r.question, r.answer, job.method, job.budget,
            len(job.visual), job.full_tokens, "vlm", answers=list(r.references), metric=r.metric,
            gestalt_tokens=job.visual.n_gestalt, prediction=text, score=answer_score(r.metric, text, r.references),
            model=settings.model, batch=n, prompt_tokens=prompt, new_tokens=steps,
            alloc_ms=round(job.alloc_ms, 2), vision_ms=round(job.vision_ms, 2),
            prefill_ms=round(times["prefill_ms"] / n, 2), decode_ms=round(times["decode_ms"] / n, 2),
            flops_vision=pf["vision"], flops_llm=pf["llm"], flops_decode=df, flops_alloc=job.flops_alloc,
            flops=pf["total"] + df + job.flops_alloc))
    return rows


def answer_pages(record: Record, arr: Any, adapter: Any, settings: EvalSettings, spec: str, seen: Any = None) -> dict:
    """One multi-page record (``Record.pages``: MP-DocVQA, SlideVQA) at budget ``spec`` over all its pages, method
    ``coc``: one budget over the pages (:func:`arr_coc.contexts.allocate`), every page's gestalt + saccades
    in one multi-image prompt (:func:`arr_coc.vlm.context.read_context`); one scored row, with the pages that got
    saccades and whether an answer page is among them (``answer_page_hit``). ``seen``: the record's pages already
    seen (:func:`arr_coc.contexts.see_context`), shared by the questions over them."""
    from arr_coc.budget import Budget
    from arr_coc.contexts import allocate, see_context, text_tokens
    from arr_coc.eval.context_run import page_texts
    from arr_coc.vlm.context import read_context

    start = time.perf_counter()
    with torch.no_grad():
        seen = seen if seen is not None else see_context(arr, [str(p) for p in record.pages])
        budget, n = Budget.parse(spec), len(seen)
        full = sum(int(h) * int(w) for scene in seen.scenes for h, w in scene.extents)
        texts = page_texts(seen) if budget.needs_text else []
        n_text = text_tokens("\n\n".join(texts)) if any(t.strip() for t in texts) else None
        total = budget.total(full, text_tokens=n_text, pages=n)
        alloc = allocate(arr, seen, record.question, Budget.parse(total))
    alloc_ms = (time.perf_counter() - start) * 1e3
    t: dict[str, float] = {}
    a = read_context(adapter, alloc.pages, settings.prompt.format(question=record.question),
                     text_tokens=alloc.text_tokens, tokenizer=alloc.tokenizer, layout=settings.layout,
                     max_new_tokens=settings.max_new_tokens, timings=t)
    looked = [i for i, p in enumerate(a.pages) if p.saccades]
    return row(record.dataset, record.record_id, record.image_id, record.kind, record.question, record.answer,
               "coc", str(spec), a.visual_tokens, a.full_tokens, "vlm", answers=list(record.references),
               metric=record.metric, gestalt_tokens=sum(p.gestalt_tokens for p in a.pages), prediction=a.text,
               score=answer_score(record.metric, a.text, record.references), model=settings.model, batch=1,
               pages=len(a.pages), answer_pages=list(record.answer_pages), saccade_pages=looked,
               answer_page_hit=bool(set(looked) & set(record.answer_pages)), text_tokens=a.text_tokens,
               compression=a.compression, alloc_ms=round(alloc_ms, 2), vision_ms=round(t.get("vision", 0.0), 2),
               prefill_ms=round(t.get("prefill", 0.0), 2), decode_ms=round(t.get("decode", 0.0), 2),
               flops_vision=a.flops["vision"], flops_llm=a.flops["llm"], flops=a.flops["total"])
