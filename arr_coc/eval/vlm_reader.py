"""The VLM as reader: every method at every token budget answered by the frozen model itself, scored by the
benchmark's own metric, with what each answer cost.

Methods (``VLM_METHODS``: the entries of :mod:`arr_coc.allocators.methods` the VLM reader can send), each
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
``records.jsonl`` (:class:`arr_coc.eval.store.RowStore`: locked, a key never written twice). A rerun,
with any number of processes, skips every (record, method, budget) already there, so nothing is
answered twice and a rank that died loses at most the batch it was answering; a folder made with other
settings (model, prompt, ...) is refused. Tables and plots: :func:`arr_coc.eval.report.write_reports`.

Multi-page records (``Record.pages``: :mod:`arr_coc.data.mpdocvqa`, :mod:`arr_coc.data.slidevqa`) are read
by :func:`answer_pages`: method ``arr`` at T tokens over all the record's pages, one multi-image prompt.
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
from PIL import Image
from tqdm import tqdm

from arr_coc.allocators.methods import (
    METHODS,
    MethodInputs,
    build_samplers,
    make_plan,
    methods_for,
)
from arr_coc.budget import budget_tokens
from arr_coc.config import MAX_NEW_TOKENS
from arr_coc.data.datasets import SHORT_ANSWER_PROMPT, Record
from arr_coc.engine.plan import Plan
from arr_coc.eval.metrics import answer_score
from arr_coc.eval.run import learned_maps, record_seed
from arr_coc.eval.store import RowStore
from arr_coc.threads import check_model
from arr_coc.vlm import encode as encode_plans
from arr_coc.vlm.answer import answer_text, decode_flops, prefill_flops
from arr_coc.vlm.generation import generate, synchronize
from arr_coc.vlm.processing import assemble, check_prompt
from arr_coc.vlm.protocol import PROCESSOR
from arr_coc.vlm.stages import look_at
from arr_coc.weights import load_learned_methods

VLM_METHODS = methods_for("vlm")  # in table order
DEFAULT_METHODS = ("full", "native_budget", "arr", "slice")
DEFAULT_TOKENS = ("256", "529", "1024")  # 256 = 8x8 gestalt + 192 saccades; 529 = 16x16 + 273; 1024 = 16x16 + 768
PROMPT = SHORT_ANSWER_PROMPT  # every dataset's default template (DatasetSpec.prompt)


@dataclass
class VLMEvalSettings:
    """What a VLM evaluation runs: the methods, each at every total token count of ``tokens``, and how it answers.

    ``tokens`` holds token specs (T, gestalt + saccades): a count (``529``) or a share of the full-resolution
    canvas (``"25%"``). A row's ``budget`` column holds the spec as asked (``"full"`` for a method with one
    plan), so result folders and the published tables stay valid; ``tokens`` holds what was sent.
    """

    methods: Sequence[str] = DEFAULT_METHODS
    tokens: Sequence[str | int] = DEFAULT_TOKENS
    batch_size: int = 8  # answers generated together (left-padded prompts)
    max_new_tokens: int = MAX_NEW_TOKENS  # short answers; a longer answer is cut, and scored as cut
    prompt: str = PROMPT  # "{question}" is replaced by the record's question
    layout: str = "scaled"  # saccade positions (arr_coc.vlm.LAYOUTS)
    seed: int = 0  # the random sampler's seed (per record)
    model: str = ""  # the model's name, written in every row
    patch_options: dict | None = None  # keyword options of the patch allocators
    learned: dict | None = None  # weights of "selector" / "pruner" (default: the packaged ones)
    fresh: bool = False  # replace rows of an output folder made with other settings (else: refuse)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in VLM_METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown} for the vlm reader; known: {', '.join(VLM_METHODS)}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(f"batch size and max new tokens must be positive, got {self.batch_size}, "
                             f"{self.max_new_tokens}")
        check_prompt(self.prompt)
        for b in self.tokens:
            budget_tokens(b, 10**9)


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


# ----------------------------------------------------------------------------- processes and files
def rank_device(device: str | None) -> str | None:
    """``cuda`` under torchrun -> this process's own GPU (``cuda:<LOCAL_RANK>``); anything else unchanged."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def process_group(device: Any) -> tuple[int, int, bool]:
    """(rank, world, created): one process, or torchrun's (nccl when the model is on a GPU, gloo on the CPU);
    ``created`` when this call started the group (and its caller ends it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, False
    created = not dist.is_initialized()
    if created:
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(torch.device(device))
        # a rank waits at the end for the slowest one: hours, not torch's default minutes
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(hours=12))
    return dist.get_rank(), world, created


def shard(records: Sequence[Record], rank: int, world: int) -> list[Record]:
    """This rank's records: every ``world``-th image (all questions of an image stay together).

    >>> from pathlib import Path
    >>> recs = [Record("d", f"{i}{q}", Path("x"), str(i), "q", "a", ()) for i in range(3) for q in "ab"]
    >>> [r.record_id for r in shard(recs, 1, 2)]
    ['1a', '1b']
    """
    images = list(dict.fromkeys(r.image_id for r in records))
    mine = {i for n, i in enumerate(images) if n % world == rank}
    return [r for r in records if r.image_id in mine]


def run_identity(arr: Any, adapter: Any, settings: VLMEvalSettings) -> dict:
    """What the answers depend on besides the record, method and budget: a resumed run must match it."""
    return {"model": settings.model, "dtype": str(adapter.visual.dtype).replace("torch.", ""),
            "prompt": settings.prompt, "max_new_tokens": settings.max_new_tokens, "layout": settings.layout,
            "seed": settings.seed, "channels": list(arr.channels), "scorer": arr.config.scorer.name,
            "scorer_weights": arr.weights_source, "sampler": arr.config.sampler.name,
            "max_pixels": arr.config.canvas.max_pixels, "patch_options": settings.patch_options or {},
            "learned": settings.learned or {}}


# ----------------------------------------------------------------------------- encoding and answering
def _timed_encode(adapter: Any, fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    synchronize(adapter.visual.device)
    return out[0], (time.perf_counter() - start) * 1e3


def _jobs(recs: Sequence[Record], arr: Any, adapter: Any, settings: VLMEvalSettings, learned: dict,
          samplers: dict, done: set) -> Iterator[Job]:
    """Every pending (record, method, budget) of one image, planned and encoded; the texture is computed once."""
    todo = {r.record_id: [(m, str(b)) for m, b in _wanted(settings) if (r.record_id, m, str(b)) not in done]
            for r in recs}
    if not any(todo.values()):
        return
    start = time.perf_counter()
    with torch.no_grad():
        scene = arr.see(recs[0].image)
        vector = arr.gestalt(scene, 1).vector
    texture_ms = (time.perf_counter() - start) * 1e3
    canvas, cell = scene.canvas, adapter.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    pixels, full = canvas.pixels[0, :, : hc * cell, : wc * cell], canvas.full_tokens[0]
    photo = None
    for record in recs:
        if not todo[record.record_id]:
            continue
        start = time.perf_counter()
        with torch.no_grad():
            relevance, query_emb = arr.score(scene, [record.question], vector)
            maps = learned_maps(learned, arr, scene, record.question, query_emb) if learned else {}
        score_ms = (time.perf_counter() - start) * 1e3
        inputs = MethodInputs(canvas, relevance.map.detach(), query_emb, sampler=arr.sampler,
                              sampler_seed=arr.config.seed, samplers=samplers, maps=maps,
                              seed=record_seed(settings.seed, record.record_id), options=settings.patch_options or {})
        for method, spec in todo[record.record_id]:
            total = full if spec == "full" else budget_tokens(spec, full)
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


def _first_look_job(record: Record, spec: str, adapter: Any, settings: VLMEvalSettings, inputs: MethodInputs,
                    total: int, pixels: Any, full: int) -> Job:
    """The ``vlm`` method: the staged path's first look (:func:`arr_coc.vlm.stages.look_at`: the gestalt encoded,
    the question's attention to it read) is the relevance ARR's sampler spends the saccades on (the registry's
    ``vlm`` method, through :func:`arr_coc.engine.samplers.select`); the gestalt tokens are reused for the answer."""
    (grid, _) = inputs.split(total)
    start = time.perf_counter()
    look = look_at(adapter, [pixels], [grid], [settings.prompt.format(question=record.question)])
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


def _wanted(settings: VLMEvalSettings) -> list[tuple[str, str]]:
    """(method, budget) pairs of a record: the methods with one plan ("full") once, the others per budget."""
    once = [(m, "full") for m in settings.methods if not METHODS.get(m).per_tokens]
    return once + [(m, str(b)) for b in settings.tokens for m in settings.methods if METHODS.get(m).per_tokens]


def answer_jobs(jobs: Sequence[Job], adapter: Any, settings: VLMEvalSettings) -> list[dict]:
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
        rows.append({
            "dataset": r.dataset, "record_id": r.record_id, "image_id": r.image_id, "kind": r.kind,
            "question": r.question,
            "answer": r.answer, "answers": list(r.references), "metric": r.metric, "method": job.method,
            "budget": job.budget, "tokens": len(job.visual), "gestalt_tokens": job.visual.n_gestalt,
            "full_tokens": job.full_tokens, "prediction": text, "score": answer_score(r.metric, text, r.references),
            "reader": "vlm", "model": settings.model, "batch": n, "prompt_tokens": prompt, "new_tokens": steps,
            "alloc_ms": round(job.alloc_ms, 2), "vision_ms": round(job.vision_ms, 2),
            "prefill_ms": round(times["prefill_ms"] / n, 2), "decode_ms": round(times["decode_ms"] / n, 2),
            "flops_vision": pf["vision"], "flops_llm": pf["llm"], "flops_decode": df, "flops_alloc": job.flops_alloc,
            "flops": pf["total"] + df + job.flops_alloc,
        })
    return rows


def answer_pages(record: Record, arr: Any, adapter: Any, settings: VLMEvalSettings, spec: str) -> dict:
    """One multi-page record (``Record.pages``: MP-DocVQA, SlideVQA) at ``spec`` total tokens over all its pages,
    method ``arr``: one budget over the pages (:func:`arr_coc.contexts.allocate_context`), every page's gestalt +
    saccades in one multi-image prompt (:func:`arr_coc.vlm.context.read_context`); one scored row, with the
    pages that got saccades and whether an answer page is among them (``answer_page_hit``)."""
    from arr_coc.contexts import allocate_context
    from arr_coc.vlm.context import read_context

    if str(spec).strip().endswith("%"):
        raise ValueError(f"a multi-page record takes its tokens as a count over all its pages, got {spec}")
    start = time.perf_counter()
    with torch.no_grad():
        alloc = allocate_context(arr, [str(p) for p in record.pages], record.question, tokens=budget_tokens(spec, 2**62))
    alloc_ms = (time.perf_counter() - start) * 1e3
    t: dict[str, float] = {}
    a = read_context(adapter, alloc.pages, settings.prompt.format(question=record.question),
                     text_tokens=alloc.text_tokens, tokenizer=alloc.tokenizer, layout=settings.layout,
                     max_new_tokens=settings.max_new_tokens, timings=t)
    looked = [i for i, p in enumerate(a.pages) if p.saccades]
    return {
        "dataset": record.dataset, "record_id": record.record_id, "image_id": record.image_id,
        "question": record.question, "answer": record.answer, "answers": list(record.references),
        "metric": record.metric, "method": "arr", "budget": str(spec), "tokens": a.visual_tokens,
        "gestalt_tokens": sum(p.gestalt_tokens for p in a.pages), "full_tokens": a.full_tokens,
        "prediction": a.text, "score": answer_score(record.metric, a.text, record.references), "reader": "vlm",
        "model": settings.model, "batch": 1, "pages": len(a.pages), "answer_pages": list(record.answer_pages),
        "saccade_pages": looked, "answer_page_hit": bool(set(looked) & set(record.answer_pages)),
        "text_tokens": a.text_tokens, "compression": a.compression, "alloc_ms": round(alloc_ms, 2),
        "vision_ms": round(t.get("vision", 0.0), 2), "prefill_ms": round(t.get("prefill", 0.0), 2),
        "decode_ms": round(t.get("decode", 0.0), 2), "flops_vision": a.flops["vision"], "flops_llm": a.flops["llm"],
        "flops": a.flops["total"],
    }


def evaluate_vlm(records: Sequence[Record], arr: Any, adapter: Any, out_dir: Path,
                 settings: VLMEvalSettings | None = None, progress: bool = True) -> Path:
    """Answer every record x method x budget with ``adapter``'s model; returns ``out_dir/records.jsonl``.

    ``arr`` allocates (its canvas cell must be the adapter's). Under torchrun each rank answers its
    share into the same folder; see the module docstring.

    Raises:
        ValueError: ``out_dir`` holds rows made with other settings (unless ``settings.fresh``), or the
            ARR's cell is not the model's.
        ThreadLimitError: a bfloat16 / float16 model on the CPU under an ``OMP_THREAD_LIMIT`` below torch's threads.
    """
    settings = settings or VLMEvalSettings()
    check_model(adapter, "eval with the VLM reader")  # before any record: a half-precision model under OMP_THREAD_LIMIT
    if arr.config.canvas.cell != adapter.cell:
        raise ValueError(f"the ARR canvas cell is {arr.config.canvas.cell} px but {adapter.name} needs {adapter.cell} px")
    if "vlm" in settings.methods:  # refused before any record is allocated, in ask's words
        adapter.require("first_look", "method 'vlm' (the VLM's first look)")
    if any(r.pages for r in records) and set(settings.methods) != {"arr"}:
        raise ValueError(f"multi-page records are read with method arr (one budget over their pages); "
                         f"leave out {', '.join(m for m in settings.methods if m != 'arr')}")
    if {"full", "native_budget"} & set(settings.methods) and PROCESSOR not in adapter.capabilities:
        raise ValueError(f"{adapter.name} has no image processor of its own to resize with; "
                         f"leave out full and native_budget")
    rank, world, created = process_group(adapter.visual.device)
    store = RowStore(out_dir)
    # rank 0 claims first: with --fresh it alone replaces old rows, before any rank appends new ones
    for turn in range(world):
        if turn == rank:
            store.claim(json.loads(json.dumps(run_identity(arr, adapter, settings), default=str)),
                        fresh=settings.fresh and rank == 0)
        if world > 1:
            dist.barrier()
    done = store.done()
    learned = load_learned_methods(arr, settings) if {"selector", "pruner"} & set(settings.methods) else {}
    samplers = build_samplers(settings.methods)
    mine = shard(records, rank, world)
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in mine:
        groups[r.image_id].append(r)
    bar = tqdm(total=len(mine), desc=f"eval {records[0].dataset if records else ''} (vlm)",
               disable=not progress or rank != 0)
    batch: list[Job] = []
    for recs in groups.values():
        if recs[0].pages:  # a multi-page record: one prompt over its pages, method arr only
            store.append([answer_pages(r, arr, adapter, settings, str(b)) for r in recs for b in settings.tokens
                          if (r.record_id, "arr", str(b)) not in done])
            bar.update(len(recs))
            continue
        for job in _jobs(recs, arr, adapter, settings, learned, samplers, done):
            batch.append(job)
            if len(batch) == settings.batch_size:
                store.append(answer_jobs(batch, adapter, settings))
                batch.clear()
        bar.update(len(recs))
    if batch:
        store.append(answer_jobs(batch, adapter, settings))
    bar.close()
    if world > 1:
        dist.barrier()  # nobody reports before every rank has written its rows
    if created:
        dist.destroy_process_group()
    return store.path
