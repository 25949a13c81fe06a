"""The VLM as reader: every method at every token budget answered by the frozen model itself, scored by the
benchmark's own metric, with what each answer cost.

Methods (``VLM_METHODS``), all through the adapters ``arr-coc ask`` uses:

- ``full``: the model's own image processor at its native resolution (capped at the canvas's
  ``max_pixels``), every token sent: the upper bound.
- ``native_budget``: the same processor with ``max_pixels`` set so the image has at most the
  budget's tokens: the model's own downscaling, the baseline to beat.
- ``arr``: gestalt + saccades from the ARR's sampler and scorer, the tower encoding only them (sparse).
- ``vlm``: the same sampler on the model's own first look (:mod:`arr_coc.vlm.look`: the question's
  attention to the gestalt tokens, spread over the cells); the gestalt encoded for the look is reused.
- ``slice``: the same cells, but the tower encodes the whole image and the chosen tokens are kept
  (pruning after the encoder).
- every sampler by name (``topk``, ``stratified``, ``random``, ...), the variable-size patch
  allocators (``patches``, ``patches_edges``, ``quadtree``) and the trained ``selector`` / ``pruner``.

A budget is the number of visual tokens (``529``) or a share of the full-resolution canvas (``25%``).
Per answer a row records the tokens sent, the allocation time (texture of the image + scoring +
selection; ``vlm``: the gestalt's encoding and the first look; ``full`` and ``native_budget`` allocate
nothing), the vision tower's time, the prefill and decode time (batched: the batch's time shared
equally among its answers), and the estimated FLOPs of the model's work (vision + LLM prefill +
decode, plus the first look for ``vlm``; the texture and OCR of ``arr`` run outside the model and
show in the allocation time only).

At scale: answers are generated ``batch_size`` at a time. Under ``torchrun --nproc_per_node N`` every
rank takes every N-th image (gloo on CPU, nccl on GPU) and appends its rows to
``records.part-<rank>.jsonl``; when all are done rank 0 merges them into ``records.jsonl``. A rerun,
with any number of processes, skips every (record, method, budget) found in any of those files, so
nothing is answered twice and a rank that died loses at most the batch it was answering.
"""
from __future__ import annotations

import inspect
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
from PIL import Image
from tqdm import tqdm

from arr_coc.budget import budget_tokens, split_budget
from arr_coc.data.datasets import SHORT_ANSWER_PROMPT, Record
from arr_coc.config import MAX_NEW_TOKENS
from arr_coc.data.datasets import Record
from arr_coc.eval.harness import (EVAL_METHODS, PatchMethod, _record_seed, learned_maps, load_learned_methods,
                                  summarize, _fmt)
from arr_coc.eval.metrics import answer_score
from arr_coc.samplers import SAMPLERS, topk_cells
from arr_coc.vlm.ask import answer_text, decode_flops, prefill_flops
from arr_coc.vlm.base import assemble, generate, synchronize

VLM_METHODS = ("full", "native_budget", "arr", "vlm", "slice", "random", "topk", "nms", "stratified",
               "adaptive_stratified", "log_polar", "patches", "patches_edges", "quadtree", "selector", "pruner")
DEFAULT_METHODS = ("full", "native_budget", "arr", "slice")
DEFAULT_BUDGETS = ("256", "529", "1024")  # 256 = 8x8 gestalt + 192 saccades; 529 = 16x16 + 273; 1024 = 16x16 + 768
PROMPT = SHORT_ANSWER_PROMPT  # every dataset's default template (DatasetSpec.prompt)
COST_COLUMNS = ("score", "alloc_ms", "vision_ms", "prefill_ms", "decode_ms", "flops")


@dataclass
class VLMEvalSettings:
    methods: Sequence[str] = DEFAULT_METHODS
    budgets: Sequence[str | int] = DEFAULT_BUDGETS
    batch_size: int = 8  # answers generated together (left-padded prompts)
    max_new_tokens: int = MAX_NEW_TOKENS  # short answers; a longer answer is cut, and scored as cut
    prompt: str = PROMPT  # "{question}" is replaced by the record's question
    layout: str = "scaled"  # saccade positions (arr_coc.vlm.LAYOUTS)
    seed: int = 0  # the random sampler's seed (per record)
    model: str = ""  # the model's name, written in every row
    patch_options: dict | None = None  # keyword options of the patch allocators
    learned: dict | None = None  # weights of "selector" / "pruner" (default: the packaged ones)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in VLM_METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown} for the vlm reader; known: {', '.join(VLM_METHODS)}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(f"batch size and max new tokens must be positive, got {self.batch_size}, "
                             f"{self.max_new_tokens}")
        if "{question}" not in self.prompt:
            raise ValueError(f"the prompt must hold {{question}}, got {self.prompt!r}")
        for b in self.budgets:
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


def _key(row: dict) -> tuple[str, str, str]:
    return row["record_id"], row["method"], str(row["budget"])


def read_rows(path: Path, repair: bool = False) -> list[dict]:
    """Rows of a JSONL file; a last line cut by an interruption is ignored (and removed when ``repair``)."""
    if not path.exists():
        return []
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        if repair:
            path.write_text(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _sources(out_dir: Path) -> list[Path]:
    return [out_dir / "records.jsonl", *sorted(out_dir.glob("records.part-*.jsonl"))]


def merge_rows(out_dir: Path) -> Path:
    """Fold every rank's part file into ``records.jsonl`` (first row of each key kept) and remove the parts."""
    rows, seen = [], set()
    for path in _sources(out_dir):
        for row in read_rows(path):
            if _key(row) not in seen:
                seen.add(_key(row))
                rows.append(row)
    target = out_dir / "records.jsonl"
    tmp = out_dir / f"records.jsonl.{os.getpid()}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, target)
    for part in _sources(out_dir)[1:]:
        part.unlink()
    return target


def run_identity(arr: Any, adapter: Any, settings: VLMEvalSettings) -> dict:
    """What the answers depend on besides the record, method and budget: a resumed run must match it."""
    return {"model": settings.model, "dtype": str(adapter.visual.dtype).replace("torch.", ""),
            "prompt": settings.prompt, "max_new_tokens": settings.max_new_tokens, "layout": settings.layout,
            "seed": settings.seed, "channels": list(arr.channels), "scorer": arr.config.scorer.name,
            "scorer_weights": arr.weights_source, "sampler": arr.config.sampler.name,
            "max_pixels": arr.config.canvas.max_pixels, "patch_options": settings.patch_options or {},
            "learned": settings.learned or {}}


def check_same_run(out_dir: Path, identity: dict) -> None:
    """Write ``run.json`` on the first run; refuse to add rows made with other settings to a folder."""
    path = out_dir / "run.json"
    if path.exists():
        saved = json.loads(path.read_text())
        changed = sorted(k for k in identity.keys() | saved.keys() if identity.get(k) != saved.get(k))
        if changed:
            raise ValueError(f"{out_dir} holds answers made with other settings ({', '.join(changed)}); "
                             f"pass another --out, or the same settings to resume")
        return
    tmp = path.with_name(f"run.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(identity, indent=1) + "\n")
    os.replace(tmp, path)  # every rank writes the same identity; one whole file wins


# ----------------------------------------------------------------------------- encoding and answering
def _timed_encode(adapter: Any, fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    synchronize(adapter.visual.device)
    return out[0], (time.perf_counter() - start) * 1e3


def _jobs(recs: Sequence[Record], arr: Any, adapter: Any, settings: VLMEvalSettings, learned: dict,
          done: set) -> Iterator[Job]:
    """Every pending (record, method, budget) of one image, encoded; the texture is computed once."""
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
    pixels, full, valid = canvas.pixels[0, :, : hc * cell, : wc * cell], canvas.full_tokens[0], canvas.valid
    photo = None
    for record in recs:
        if not todo[record.record_id]:
            continue
        start = time.perf_counter()
        with torch.no_grad():
            relevance, query_emb = arr.score(scene, [record.question], vector)
            maps = learned_maps(learned, arr, scene, record.question, query_emb) if learned else {}
        score_ms = (time.perf_counter() - start) * 1e3
        for method, spec in todo[record.record_id]:
            if method in ("full", "native_budget"):  # the model's own processor: nothing to allocate
                if photo is None:
                    with Image.open(record.image) as im:
                        photo = im.convert("RGB")
                cap = arr.config.canvas.max_tokens if method == "full" else budget_tokens(spec, full)
                visual, vision_ms = _timed_encode(adapter, adapter.encode_processed, [photo], cap)
                yield Job(record, method, spec, visual, full, 0.0, vision_ms)
                continue
            grid, k = split_budget(budget_tokens(spec, full), (hc, wc))
            start = time.perf_counter()
            if method == "vlm":
                yield _first_look_job(record, spec, arr, adapter, settings, scene, grid, k, query_emb, full)
                continue
            entry = EVAL_METHODS.get(method) if method in EVAL_METHODS else None
            if isinstance(entry, PatchMethod):
                from arr_coc.allocators.patching import PATCHERS, BudgetTooSmallError, edge_density

                name, driver = entry.patcher, entry.driver
                saliency = relevance.map if driver == "relevance" else edge_density(canvas.pixels, cell)
                patcher = PATCHERS.get(name)
                accepted = inspect.signature(patcher).parameters  # e.g. size_prior reaches the square patches only
                try:
                    patches = patcher(saliency.detach(), k, valid=valid, pixels=canvas.pixels,
                                      **{key: v for key, v in (settings.patch_options or {}).items() if key in accepted})
                except BudgetTooSmallError:  # a quadtree cannot start below its first tiling: no row, as in the harness
                    continue
                boxes = patches.boxes[0, : int(patches.counts[0])]
                select_ms = (time.perf_counter() - start) * 1e3
                visual, vision_ms = _timed_encode(adapter, adapter.encode_patches, [pixels], [boxes], gestalt=[grid],
                                                  layout=settings.layout)
            else:
                if method in maps:
                    positions = topk_cells(maps[method], k, valid).positions[0]
                else:
                    sampler = arr.sampler if method in ("arr", "slice") else SAMPLERS.get(method)()
                    generator = torch.Generator().manual_seed(_record_seed(settings.seed, record.record_id))
                    with torch.no_grad():
                        positions = sampler(relevance.map.detach(), k, valid=valid, query_emb=query_emb,
                                            generator=generator).positions[0]
                select_ms = (time.perf_counter() - start) * 1e3
                visual, vision_ms = _timed_encode(adapter, adapter.encode, [pixels], [positions],
                                                  mode="slice" if method == "slice" else "sparse", gestalt=[grid],
                                                  layout=settings.layout)
            yield Job(record, method, spec, visual, full, texture_ms + score_ms + select_ms, vision_ms)


def _first_look_job(record: Record, spec: str, arr: Any, adapter: Any, settings: VLMEvalSettings, scene: Any,
                    grid: tuple[int, int], k: int, query_emb: Any, full: int) -> Job:
    """The ``vlm`` method: the model encodes the gestalt and reads the question's attention to it (first look);
    ARR's sampler spends the saccades on that map; the gestalt tokens are reused for the answer."""
    from arr_coc.vlm.look import first_look

    canvas, cell = scene.canvas, adapter.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    pixels = canvas.pixels[0, :, : hc * cell, : wc * cell]
    question = settings.prompt.format(question=record.question)
    start = time.perf_counter()
    gestalt = adapter.encode_gestalt([pixels], [grid])
    look = first_look(adapter, gestalt, [grid], [question])
    relevance = torch.full(canvas.valid.shape, -torch.inf)
    relevance[0, :hc, :wc] = look.cell_maps([(hc, wc)])[0].float().cpu()
    generator = torch.Generator().manual_seed(_record_seed(settings.seed, record.record_id))
    positions = arr.sampler(relevance, k, valid=canvas.valid, query_emb=query_emb, generator=generator).positions[0]
    synchronize(adapter.visual.device)
    alloc_ms = (time.perf_counter() - start) * 1e3
    pre, suf = adapter.prompt_ids(question)
    looked = prefill_flops(adapter, len(pre) + len(gestalt[0]) + len(suf), gestalt[0].vision_segments)["total"]
    visual, vision_ms = _timed_encode(adapter, adapter.encode, [pixels], [positions], mode="sparse", gestalt=[grid],
                                      layout=settings.layout, encoded=gestalt)
    return Job(record, "vlm", spec, visual, full, alloc_ms, vision_ms, looked)


def _wanted(settings: VLMEvalSettings) -> list[tuple[str, str]]:
    pairs = [("full", "full")] if "full" in settings.methods else []
    return pairs + [(m, str(b)) for b in settings.budgets for m in settings.methods if m != "full"]


def answer_jobs(jobs: Sequence[Job], adapter: Any, settings: VLMEvalSettings) -> list[dict]:
    """Generate the answers of ``jobs`` as one batch and score them: one row per job."""
    prompts = [adapter.prompt_ids(settings.prompt.format(question=j.record.question)) for j in jobs]
    prefill = assemble(adapter.embed_tokens, [p[0] for p in prompts], [j.visual for j in jobs],
                       [p[1] for p in prompts], adapter.rope_rows)
    times: dict[str, float] = {}
    tokens, _ = generate(adapter, prefill, max_new_tokens=settings.max_new_tokens,
                         eos_token_id=adapter.text_config.eos_token_id, timings=times)
    rows, n = [], len(jobs)
    for job, (pre, suf), generated in zip(jobs, prompts, tokens.tolist()):
        text, ids = answer_text(adapter, generated)
        steps = min(len(ids) + 1, len(generated))  # the end-of-sequence step is decoded too
        prompt = len(pre) + len(job.visual) + len(suf)
        pf, df = prefill_flops(adapter, prompt, job.visual.vision_segments), decode_flops(adapter, prompt, steps)
        r = job.record
        rows.append({
            "dataset": r.dataset, "record_id": r.record_id, "image_id": r.image_id, "question": r.question,
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


def evaluate_vlm(records: Sequence[Record], arr: Any, adapter: Any, out_dir: Path,
                 settings: VLMEvalSettings | None = None, progress: bool = True) -> Path:
    """Answer every record x method x budget with ``adapter``'s model; returns ``out_dir/records.jsonl``.

    ``arr`` allocates (its canvas cell must be the adapter's). Under torchrun each rank answers its
    share and rank 0 merges; see the module docstring.
    """
    settings = settings or VLMEvalSettings()
    if arr.config.canvas.cell != adapter.cell:
        raise ValueError(f"the ARR canvas cell is {arr.config.canvas.cell} px but {adapter.name} needs {adapter.cell} px")
    if {"full", "native_budget"} & set(settings.methods) and not hasattr(adapter, "encode_processed"):
        raise ValueError(f"{adapter.name} has no image processor of its own to resize with; "
                         f"leave out full and native_budget")
    rank, world, created = process_group(adapter.visual.device)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_same_run(out_dir, run_identity(arr, adapter, settings))
    done = {_key(row) for path in _sources(out_dir) for row in read_rows(path)}
    own = out_dir / f"records.part-{rank}.jsonl"
    read_rows(own, repair=True)
    learned = load_learned_methods(arr, settings) if {"selector", "pruner"} & set(settings.methods) else {}
    mine = shard(records, rank, world)
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in mine:
        groups[r.image_id].append(r)
    bar = tqdm(total=len(mine), desc=f"eval {records[0].dataset if records else ''} (vlm)",
               disable=not progress or rank != 0)
    with own.open("a") as sink:
        batch: list[Job] = []

        def flush() -> None:
            for row in answer_jobs(batch, adapter, settings):
                sink.write(json.dumps(row) + "\n")
            sink.flush()
            batch.clear()

        for recs in groups.values():
            for job in _jobs(recs, arr, adapter, settings, learned, done):
                batch.append(job)
                if len(batch) == settings.batch_size:
                    flush()
            bar.update(len(recs))
        if batch:
            flush()
    bar.close()
    if world > 1:
        dist.barrier()
    if rank == 0:
        merge_rows(out_dir)
    if world > 1:
        dist.barrier()  # nobody reads records.jsonl before rank 0 has written it
    if created:
        dist.destroy_process_group()
    return out_dir / "records.jsonl"


# ----------------------------------------------------------------------------- tables and plots
def markdown_table(summary: Sequence[dict], metric: str) -> str:
    """Accuracy and cost per (budget, method): the table a user reads accuracy against cost from."""
    lines = [f"| budget | method | tokens (share of full) | n | {metric} | alloc ms | vision ms | prefill ms "
             "| decode ms | TFLOPs |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['budget']} | {s['method']} | {s['tokens']:.0f} ({_fmt(s['share'], True)}) | {s['n']} | "
                     f"{_fmt(s['score'])} | {s['alloc_ms']:.1f} | {s['vision_ms']:.1f} | {s['prefill_ms']:.1f} | "
                     f"{s['decode_ms']:.1f} | {s['flops'] / 1e12:.4g} |")
    return "\n".join(lines)


def write_reports(jsonl: Path) -> tuple[Path, Path, Path]:
    """records.jsonl -> summary.csv, summary.md and summary.png (accuracy vs tokens and vs FLOPs) beside it."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = read_rows(jsonl)
    summary = summarize(rows, columns=COST_COLUMNS, methods=VLM_METHODS)
    metric = rows[0]["metric"] if rows else "score"
    out = jsonl.parent
    csv_path, md_path, png_path = out / "summary.csv", out / "summary.md", out / "summary.png"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    md_path.write_text(markdown_table(summary, metric) + "\n")
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    for i, method in enumerate(VLM_METHODS):
        pts = sorted((s["tokens"], s["flops"] / 1e12, s["score"]) for s in summary if s["method"] == method)
        if not pts:
            continue
        colour = matplotlib.colormaps["tab20"](i)
        for ax, x in ((axes[0], 0), (axes[1], 1)):
            if method == "full":
                ax.axhline(pts[0][2], color="k", ls="--", lw=1, label="full resolution")
            else:
                ax.plot([p[x] for p in pts], [p[2] for p in pts], marker="o", color=colour, label=method,
                        ls=":" if method == "native_budget" else "-")
    for ax, label in ((axes[0], "visual tokens sent"), (axes[1], "estimated TFLOPs per answer")):
        ax.set_xlabel(label)
        ax.set_ylabel(metric)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    model = rows[0].get("model", "") if rows else ""
    fig.suptitle(f"{rows[0]['dataset'] if rows else ''}: {model} answering at equal visual tokens")
    fig.savefig(png_path, dpi=110)
    return csv_path, md_path, png_path
