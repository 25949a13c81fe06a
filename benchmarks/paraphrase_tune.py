"""Choosing the context coupling's retrieval settings on validation questions: answer coverage over a grid.

    python benchmarks/paraphrase_tune.py --split val --cache /tmp/ptune --compression 10 20 \\
        --rerank 0 32 --spread 0 0.5 --front-floor 0 0.5

For every question of ``texlive-paraphrase`` (hand-written, over a window of up to 20 pages) or
``texlive-contexts`` (generated, quoting their page; ``--dataset``) of the validation or train split (a
setting is never chosen on test questions) the ranking's parts are computed once and kept in ``--cache``:
each window page's words and lines from the PDF's text layer at 100 dpi moved onto its canvas, the lines'
passage embeddings (bge-small), the question's line scores, BM25 line scores (bm25s) and the cross-encoder's
logits for the best lines of every first stage. **Each page's ARR relevance is set to zero** (``--relevance
zero``, the default): nothing is rendered and no ARR runs, so this measures the text parts alone. ``--relevance
arr`` reads each page's ARR relevance for the question as the full pipeline does (the window rendered at 100 dpi,
seen by the eval's default ARR, each question scored: ~20 s a window, kept in the cache beside the parts);
``ink`` reads the share of each cell that the text layer's word boxes cover (question-free, nothing rendered: what
a text-layer page is ranked on by default, ``arr_coc.contexts.ranking.LAYER_RELEVANCE``).

Each setting then ranks the cells (:func:`arr_coc.contexts.ranking_score`, :func:`arr_coc.contexts.rank_cells`)
with K from T = text tokens / compression, as a context allocation splits it, and scores the answer's
coverage (:func:`coc_tune.coverage`, the best-covered occurrence) and strict = coverage >= 0.5, overall and
per kind. A setting: the retrieval weight and top, BM25 fused into the line scores (``cos + w * bm25 / max``),
the cross-encoder reordering the first stage's best N lines (line text or passage, ``boost`` adding its own
ramp; ``keep``: the first stage's standardised score beside the logits in the order), a prior on each line from its
page's best line (``page_prior``), the value passed on to the next line (``spread``; ``around``: and the line
before) and a floor on the first lines of a document's first page (``front``), how a line's value is painted on its
cells (``head``: its first cells at its value, ``tail``: the rest at that times it; head 0 = the whole line), the
floor on lines holding a span of the question's answer type (``typed``: a date, a version, a person's name), and the
gestalt side below which a page of several gets 1x1 (``legible``: the rest of the total goes to saccades), each line's
own cosine mixed into its passage's (``line_mix``: the lines embedded alone once more, kept in the cache) and the
passage read after its section heading (``heading_mix``: :func:`heading_passages`, likewise kept) and by a second
retriever (``minilm_mix``: all-MiniLM-L6-v2's cosine on bge-small's scale, :func:`on_scale_of`), coarse to
fine (``refine``: the lines scored by every third line's passage, the N best chunks' lines by their own, as
:class:`arr_coc.contexts.line_embeddings.LineEmbeddings` scores a seen context), and, as a ceiling rather than a
setting, an ``oracle`` rank R: the lines holding the answer moved to ranks R, R+1, ... of the first stage (0: the
retriever's own order), how much of the coverage a better line ranking could buy. Writes grid.csv, summary.md and
per_question.json (each question's coverage under the first setting) in ``--out``; ``--against`` another run's
per_question.json adds paired columns against it (another code on the same questions, each with its own ``--cache``);
ms per question of each online part (question embedding, BM25, reranking the N lines, the text parts) go in the
summary, with the first setting's coverage by the rank its first stage gives the answer's best-ranked line.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from coc_tune import coverage  # the benchmark beside this one (a script's folder is on its path)
from tqdm import tqdm

from arr_coc.budget import LEGIBLE_SIDE, Budget
from arr_coc.config import CanvasConfig
from arr_coc.contexts import rank_cells, ranking_score, text_tokens
from arr_coc.contexts.answer_types import SHAPES, question_typed_lines, shaped_lines, shaped_words
from arr_coc.contexts.line_embeddings import CHUNK_STRIDE, best_chunks, chunk_centres, chunk_lines, chunk_scores
from arr_coc.contexts.line_values import (
    FRONT_FLOOR,
    FRONT_LINES,
    PAGE_PRIOR,
    RERANK_KEEP,
    SHAPE_BOOST,
    SPREAD,
    TYPED_FLOOR,
    line_values,
    standardised,
    top_lines,
)
from arr_coc.contexts.pagetext import canvas_words
from arr_coc.contexts.ranking import (
    BM25_WEIGHT,
    LINE_HEAD,
    LINE_TAIL,
    RETRIEVAL_TOP,
    RETRIEVAL_WEIGHT,
    TOKEN_REST,
    bm25_line_scores,
    fuse_bm25,
    ink_map,
    line_scores,
    passage_texts,
    retrieval_map,
    text_parts,
    unit,
)
from arr_coc.data.context_jsonl import find_answer
from arr_coc.engine.canvas import smart_resize
from arr_coc.engine.imageops import paint_boxes
from arr_coc.eval.intervals import bootstrap_mean

DPI = 100.0
FIRST_STAGES = (0.0,)  # BM25 fusion weights whose best lines the cross-encoder reads (cached once)
# the most lines a setting reranks: 32 passages cost ~1.1 s on this machine's 2 cores (the goal: <= 2 s a question)
RERANK_MAX = 32


def windows(dataset: str, split: str, n_docs: int, n_questions: int):
    """(window id, its pages (text layer; words in page px), questions [(id, question, kind, answer page, boxes)],
    (the PDF, its pages))."""
    from arr_coc.documents.pdf import read_pdf

    if dataset == "texlive-paraphrase":
        from arr_coc.data.paraphrase import texlive_paraphrase

        groups: dict = {}
        for q in texlive_paraphrase(split):
            groups.setdefault((q.document, q.page_range, q.path), []).append(q)
        for (doc, pages, path), qs in groups.items():
            ctx = read_pdf(path, pages=pages, dpi=DPI, render=False)
            first = ctx.pages[0].index
            out = []
            for q in qs:
                at = q.answer_page - 1 - first
                out.append((q.id, q.question, q.kind, at, list(find_answer(ctx.pages[at].words, q.answers))))
            yield f"{doc}#{pages}", ctx, out, (path, pages)
    else:
        from arr_coc.data.contexts import texlive_context_set
        from arr_coc.documents.corpus import documents

        paths = {d.name: d.path for d in documents(split=split)}
        items, _, _ = texlive_context_set(split=split, contexts=n_docs, questions=n_questions, dpi=DPI)
        for item in items:  # the window's text layer, not rendered (the questions' boxes are on it)
            ctx = read_pdf(paths[item.context_id.split("#")[0]], pages="1-20", dpi=DPI, render=False)
            yield item.context_id, ctx, [(q.record_id, q.question, q.kind, q.pages[0], [q.boxes])
                                         for q in item.questions], (paths[item.context_id.split("#")[0]], "1-20")


def embed_pages(retriever, texts: list[list[str]]) -> list[torch.Tensor | None]:
    """Per page its texts' passage vectors [n_i, D] in one call (None: a page without texts)."""
    flat = [t for ts in texts for t in ts]
    emb = retriever.passages(flat) if flat else torch.zeros(0, 384)
    return [e if len(e) else None for e in torch.split(emb, [len(ts) for ts in texts])] if texts else []


def fused(q: dict, w: float) -> list[torch.Tensor]:
    """The first stage: each page's lines' cosine + w * BM25 / the context's best BM25 (as the library fuses them)."""
    return fuse_bm25(q["cos"], q["bm25"], w)


def window_canvas(ctx, canvas: CanvasConfig) -> tuple[list, list, list]:
    """Each page's canvas size (h, w) and its text layer's words and lines moved onto it, as a context sees them."""
    sizes, words, lines = [], [], []
    for p in ctx.pages:
        size = smart_resize(p.size[0], p.size[1], canvas.cell, canvas.min_pixels, canvas.max_pixels)
        ws, ls = canvas_words(p, size)
        sizes.append(size), words.append(ws), lines.append(ls)
    return sizes, words, lines


def prepare(wid: str, ctx, qs: list, cache: Path, retriever, reranker, canvas: CanvasConfig,
            stride: int = 1) -> dict:
    """Everything a window's questions need, once (cached in ``cache``; ``stride``: every line's passage embedded, or
    every stride-th line's, each line scored by the passages it is part of)."""
    path = cache / (wid.replace("/", "_").replace("#", "_") + ".pt")
    if path.is_file():
        out = torch.load(path, weights_only=False)
        if out.get("stride", 1) != stride:
            raise SystemExit(f"paraphrase_tune.py: {cache} holds windows made with --stride {out.get('stride', 1)}; "
                             f"give another --cache for --stride {stride}")
        if out.get("rerank_alone") and out.get("first_stages") == list(FIRST_STAGES):
            return out
        rerank_all(out, reranker)  # cached before each pair ran alone, or for other first stages
        torch.save(out, path)
        return out
    cell = canvas.cell
    sizes, words, lines = window_canvas(ctx, canvas)
    picked = [chunk_centres(len(ls), stride) for ls in lines]
    texts = [[every[c] for c in cs] for every, cs in zip(map(passage_texts, lines), picked)]
    embeddings = embed_pages(retriever, texts)
    line_text = [[t for t, _ in ls] for ls in lines]
    start = time.perf_counter()
    bm = [bm25_line_scores(line_text, q[1]) for q in qs]
    bm_ms = (time.perf_counter() - start) * 1e3 / max(1, len(qs))
    out = {"sizes": sizes, "words": words, "lines": lines, "first": [p.index == 0 for p in ctx.pages],
           "n_text": text_tokens("\n\n".join(p.text for p in ctx.pages)), "questions": [], "stride": stride,
           "embedded": sum(map(len, texts))}
    for (qid, question, kind, at, options), b in zip(qs, bm):
        t: dict[str, float] = {"bm25": bm_ms}
        start = time.perf_counter()
        cos = line_scores(embeddings, retriever.queries([question])[0])
        if stride > 1:
            cos = [chunk_scores(c, len(ls), cs) for c, ls, cs in zip(cos, lines, picked)]
        t["embed"] = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        zeros = [torch.zeros(h // cell, w // cell) for h, w in sizes]
        parts = text_parts(cell, sizes, zeros, words, lines, question, None)
        t["text_parts"] = (time.perf_counter() - start) * 1e3
        out["questions"].append({"id": qid, "question": question, "kind": kind, "at": at, "options": options,
                                 "cos": cos, "bm25": b, "parts": parts, "ms": t})
    rerank_all(out, reranker)
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)
    return out


# a heading: a short line numbered like a section ("3.2 Options", "A Examples") or set taller than the window's lines
HEADING = re.compile(r"^(\d+(\.\d+)*|[A-Z]|Chapter \d+|Appendix [A-Z])\.?\s+\S")


def heading_passages(lines: list[list]) -> list[list[str]]:
    """Each line's passage read after the last heading above it in the window (``"<heading>: <passage>"``; as it is
    without one): a short line (< 70 characters, 3 letters in a row) numbered like a section or set more than 1.25 x
    the window's median line height.

    >>> heading_passages([[("2.1 Fonts", (0, 0, 10, 50)), ("use bold", (12, 0, 22, 50))]])
    [['2.1 Fonts use bold', '2.1 Fonts: 2.1 Fonts use bold']]
    """
    heights = [b[2] - b[0] for ls in lines for _, b in ls]
    tall = 1.25 * statistics.median(heights) if heights else 0.0
    heading, out = "", []
    for ls in lines:
        page = []
        for (text, b), passage in zip(ls, passage_texts(ls)):
            if len(text) < 70 and re.search("[A-Za-z]{3}", text) and (HEADING.match(text) or b[2] - b[0] > tall):
                heading = text
            page.append(f"{heading}: {passage}" if heading and heading != text else passage)
        out.append(page)
    return out


# the first-stage variants a setting mixes into each line's passage cosine: the setting, the question's cached
# cosines, the texts embedded for them per page
VARIANTS = {"line_mix": ("line_cos", lambda lines: [[t for t, _ in ls] for ls in lines]),  # each line read alone
            "heading_mix": ("heading_cos", heading_passages),  # each passage read after its section heading
            # each passage read by a second retriever (all-MiniLM-L6-v2), its cosines put on bge-small's scale
            "minilm_mix": ("minilm_cos", lambda lines: list(map(passage_texts, lines)))}
# the variants read by another retriever than the first stage's (the rest: bge-small)
VARIANT_RETRIEVERS = {"minilm_mix": "minilm"}


def on_scale_of(x: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
    """Another model's cosines ``x`` per page, standardised over the window's lines and put on the mean and spread of
    ``c`` (the first stage's): two models' cosines live on different scales, so mixing them raw weighs the wider.

    >>> [[round(v, 4) for v in t.tolist()] for t in on_scale_of([torch.tensor([0.0, 2.0])], [torch.tensor([0.5, 0.7])])]
    [[0.5, 0.7]]
    """
    cs = torch.cat(list(c))
    return list(torch.split(standardised(torch.cat(list(x))) * cs.std() + cs.mean(), [len(t) for t in x]))


def add_cosines(win: dict, retriever, key: str, texts_of) -> bool:
    """Each question's cosine with the window's texts ``texts_of(lines)`` per page (``q[key]``), where not cached yet;
    True when computed (the caller saves the window)."""
    if all(key in q for q in win["questions"]):
        return False
    embeddings = embed_pages(retriever, texts_of(win["lines"]))
    for q in win["questions"]:
        q[key] = line_scores(embeddings, retriever.queries([q["question"]])[0])
    return True


def rerank_all(win: dict, reranker) -> None:
    """The cross-encoder's logit of every line any first stage ranks among its RERANK_MAX best, read as the line
    alone and as its passage, per question (each pair run alone: its logit does not depend on the others)."""
    line_text = [[t for t, _ in ls] for ls in win["lines"]]
    texts = [passage_texts(ls) for ls in win["lines"]]
    for q in win["questions"]:
        q["rerank"] = {}
        picked = sorted({x for w in FIRST_STAGES for x in top_lines(fused(q, w), RERANK_MAX)})
        for how, source in (("line", line_text), ("passage", texts)):
            start = time.perf_counter()
            logits = reranker.rerank(q["question"], [source[p][i] for p, i in picked]) if picked else torch.zeros(0)
            q["ms"][f"rerank_{how}_per_pair"] = (time.perf_counter() - start) * 1e3 / max(1, len(picked))
            q["rerank"][how] = dict(zip(picked, logits.tolist()))
    win["rerank_alone"], win["first_stages"] = True, list(FIRST_STAGES)


def arr_relevance(wid: str, source: tuple, qs: list, cache: Path, arr, sizes: list, cell: int) -> list:
    """Per question, each page's ARR relevance [hc, wc] (scaled to [0, 1]) as the full pipeline scores it under
    ``layer_relevance="arr"`` (cached in ``cache``): the window rendered at 100 dpi and seen once
    (:func:`arr_coc.contexts.see_context`), each question's :func:`arr_coc.contexts.rank_parts`."""
    from arr_coc.contexts import rank_parts, see_context
    from arr_coc.documents.pdf import read_pdf

    path = cache / (wid.replace("/", "_").replace("#", "_") + ".arr.pt")
    if path.is_file():
        return torch.load(path, weights_only=False)
    seen = see_context(arr, read_pdf(source[0], pages=source[1], dpi=DPI), layer_relevance="arr")
    out = []
    with torch.no_grad():
        for q in qs:
            rels = [part.relevance.float() for part in rank_parts(arr, seen, q[1])]
            assert [tuple(r.shape) for r in rels] == [(h // cell, w // cell) for h, w in sizes], wid
            out.append(rels)
    torch.save(out, path)
    return out


def ink(win: dict, cell: int) -> list[torch.Tensor]:
    """Each page's share of every cell [hc, wc] that its words' boxes cover (:func:`arr_coc.contexts.ranking.ink_map`,
    what a text-layer page is ranked on by default)."""
    return [ink_map(ws, size, cell) for size, ws in zip(win["sizes"], win["words"])]


SETTING = ("weight", "top", "bm25", "rerank", "text", "boost", "keep", "spread", "around", "front_lines", "front_floor",
           "head", "tail", "typed", "page_prior", "legible", "relevance", "line_mix", "heading_mix", "minilm_mix",
           "refine", "oracle", "shape_boost", "shapes", "rest")
RANK_BUCKETS = ((1, 1), (2, 5), (6, 20), (21, 64), (65, 192), (193, None))  # the answer line's rank in the first stage


def answer_lines(win: dict, q: dict) -> list[int]:
    """The lines of the answer's page that touch an occurrence of the answer (canvas boxes overlapping)."""
    boxes = [b for occurrence in q["options"] for b in occurrence]
    return [i for i, (_, (y0, x0, y1, x1)) in enumerate(win["lines"][q["at"]])
            if any(y0 < b[2] and b[0] < y1 and x0 < b[3] and b[1] < x1 for b in boxes)]


def answer_rank(scores: list[torch.Tensor], at: int, held: list[int]) -> int | None:
    """The first-stage rank (1 = the context's best line) of the best-scored line holding the answer, a line that does
    not hold it scoring the same counting against it (as ``line_retrieval.py`` counts ties); None: no line holds it."""
    if not held:
        return None
    best = float(scores[at][held].max())
    others = [s >= best for s in scores]
    others[at][held] = False
    return 1 + sum(int(o.sum()) for o in others)


def oracle(scores: list[torch.Tensor], at: int, held: list[int], rank: int) -> list[torch.Tensor]:
    """``scores`` with the lines holding the answer moved to ranks ``rank``, ``rank`` + 1, ... (their order kept),
    every other line in its place (at rank 1 as far above the best other line as it is above the next one);
    unchanged for rank 0 or an answer no line holds.

    >>> [[round(v, 6) for v in s.tolist()] for s in oracle([torch.tensor([0.9, 0.1]), torch.tensor([0.5, 0.7])],
    ...                                                     0, [1], 2)]
    [[0.9, 0.8], [0.5, 0.7]]
    >>> [round(v, 4) for v in oracle([torch.tensor([0.9, 0.1, 0.2, 0.5])], 0, [1, 2], 1)[0].tolist()]
    [0.9, 1.0333, 1.1667, 0.5]
    """
    if not rank or not held:
        return scores
    mask = [torch.zeros(len(s), dtype=torch.bool) for s in scores]
    mask[at][held] = True
    others = [float(v) for v in torch.cat([s[~m] for s, m in zip(scores, mask)]).sort(descending=True).values]
    gap = others[0] - others[1] if len(others) > 1 and others[0] > others[1] else 0.01  # the scale kept at rank 1
    if not others:
        above = 1.0
    else:  # the score of the line just above the slot (past the last line: the last line's)
        above = others[0] + gap if rank == 1 else others[min(rank - 2, len(others) - 1)]
    below = others[rank - 1] if rank <= len(others) else above - gap
    order = sorted(held, key=lambda i: -float(scores[at][i]))
    out = [s.clone() for s in scores]
    for j, i in enumerate(order):  # evenly between the line above the slot and the one below, in their order
        out[at][i] = above - (above - below) * (j + 1) / (len(order) + 1)
    return out


def refined(cos: list[torch.Tensor], chunks: int) -> list[torch.Tensor]:
    """Coarse to fine, as :class:`arr_coc.contexts.line_embeddings.LineEmbeddings` scores a seen context's lines:
    each line by its chunk's passage (every third line's), the lines of the context's ``chunks`` best chunks by their
    own passage (0: every line by its own, every passage embedded). Exact: each passage is embedded alone, so its
    cosine in ``cos`` is the one the library's refinement computes.

    >>> [round(v, 2) for v in refined([torch.tensor([0.1, 0.2, 0.3, 0.9, 0.5, 0.4])], 1)[0].tolist()]
    [0.2, 0.2, 0.2, 0.9, 0.5, 0.4]
    """
    if not chunks:
        return cos
    picked = [chunk_centres(len(c), CHUNK_STRIDE) for c in cos]
    centre = [c[cs] for c, cs in zip(cos, picked)]
    out = [chunk_scores(cen, len(c), cs) for cen, c, cs in zip(centre, cos, picked)]
    for p, k in best_chunks(centre, picked, chunks):
        span = chunk_lines(k, len(cos[p]))
        out[p][span.start: span.stop] = cos[p][span.start: span.stop]
    return out


def values_for(win: dict, q: dict, s: dict) -> list[torch.Tensor]:
    """Each page's lines' retrieval values under setting ``s`` (:func:`arr_coc.contexts.ranking.line_values`, the
    cross-encoder's cached logits standing in for the model)."""
    logits = q["rerank"][s["text"]]
    if "typed" not in q:  # the lines holding the question's answer type, once per question (None: it has none)
        q["typed"] = question_typed_lines(q["question"], [[t for t, _ in ls] for ls in win["lines"]])
    cos = q["cos"]
    for mix, (key, _) in VARIANTS.items():
        if s[mix]:
            other = on_scale_of(q[key], q["cos"]) if mix in VARIANT_RETRIEVERS else q[key]
            cos = [(1 - s[mix]) * c + s[mix] * x for c, x in zip(cos, other)]
    first = oracle(fuse_bm25(refined(cos, s["refine"]), q["bm25"], s["bm25"]), q["at"], q["held"], s["oracle"])
    if s["shape_boost"] and ("shaped", s["shapes"]) not in q:  # once per question and set of shapes
        q["shaped", s["shapes"]] = shaped_lines(q["question"], [[t for t, _ in ls] for ls in win["lines"]],
                                                s["shapes"].split(","))
    return line_values(first, win["first"], lambda picked: torch.tensor([logits[x] for x in picked]),
                       s["top"], s["rerank"], s["boost"], s["spread"], bool(s["around"]), s["front_lines"],
                       s["front_floor"], q["typed"], s["typed"], s["keep"], s["page_prior"],
                       q.get(("shaped", s["shapes"])), s["shape_boost"])


def score(win: dict, q: dict, s: dict, cell: int, compressions: list[float]) -> dict[float, float]:
    """The answer's coverage at each compression under setting ``s`` (the best-covered occurrence; 0 without one)."""
    values = values_for(win, q, s)
    ranks = []
    rels = q.get("relevance", {}).get(s["relevance"]) or [None] * len(q["parts"])
    if ("words", s["shapes"]) not in q:  # the words holding a token of a shape it names, once per set of shapes
        q["words", s["shapes"]] = (shaped_words(q["question"], win["words"], s["shapes"].split(","))
                                   or [()] * len(win["words"]))
    for part, size, ls, v, rel, tk in zip(q["parts"], win["sizes"], win["lines"], values, rels,
                                          q["words", s["shapes"]]):
        found = retrieval_map(ls, v, size, cell, s["head"], s["tail"], tk, s["rest"])[: part.text.shape[0],
                                                                                       : part.text.shape[1]]
        part = replace(part, retrieval=found) if rel is None else replace(part, retrieval=found, relevance=unit(rel))
        ranks.append(ranking_score(part, retrieval_weight=s["weight"]))
    grids = [(h // cell, w // cell) for h, w in win["sizes"]]
    at, out = q["at"], {}
    for c in compressions:
        _, k = Budget.parse(f"{c:g}x").split(grids, text_tokens=win["n_text"], legible=s["legible"])
        cells = rank_cells(ranks, k)[at]
        hit = torch.zeros(grids[at])
        hit[cells[:, 0], cells[:, 1]] = 1
        out[c] = max((float((pooled * hit).sum() / total) for pooled, total in q["pooled"]), default=0.0)
    return out


def pooled_boxes(q: dict, size: tuple[int, int], cell: int) -> list[tuple[torch.Tensor, float]]:
    """Per occurrence of the answer, its area in each cell [hc, wc] and its whole area (canvas px)."""
    out, (hc, wc) = [], (size[0] // cell, size[1] // cell)
    for boxes in q["options"]:
        if not boxes:
            continue
        mask = paint_boxes(torch.tensor(boxes, dtype=torch.float32), torch.ones(len(boxes)), tuple(size))
        cells = mask[: hc * cell, : wc * cell].reshape(hc, cell, wc, cell).sum((1, 3))
        out.append((cells, float(mask.sum().clamp_min(1e-9))))
    return out


def canvas_options(win: dict, q: dict, page_size: tuple[int, int]) -> list:
    """The answer's occurrences moved from page px onto the canvas."""
    h, w = win["sizes"][q["at"]]
    sy, sx = h / page_size[0], w / page_size[1]
    return [[(b[0] * sy, b[1] * sx, b[2] * sy, b[3] * sx) for b in boxes] for boxes in q["options"]]


def write(args: argparse.Namespace, grid: list[dict], cov: dict, kinds: dict[str, int], ms: dict) -> None:
    cols = [(c, m) for c in args.compression for m in ("coverage", "strict")]
    # every question's coverage under the first setting, for a later run's --against (another code, the same questions)
    with open(args.out / "per_question.json", "w") as f:
        json.dump({"command": sys.argv[1:], "ids": cov["ids"],
                   "coverage": {f"{c:g}": cov[0][c] for c in args.compression}}, f)
    against = args.against_run
    if against:
        if against["ids"] != cov["ids"]:
            raise SystemExit(f"--against {args.against}: its questions are not this run's (same --dataset, --split, "
                             f"--limit, --start?)")
    pair = ["vs row 1"] + (["vs against"] if against else [])
    rows = []
    for i, s in enumerate(grid):
        vals = {c: cov[i][c] for c in args.compression}
        row = {**s}
        for c in args.compression:
            row[f"{c:g}x coverage"] = statistics.fmean(vals[c])
            row[f"{c:g}x strict"] = statistics.fmean(float(v >= 0.5) for v in vals[c])
            for kind in kinds:
                ks = [v for v, k in zip(vals[c], cov["kinds"]) if k == kind]
                row[f"{c:g}x {kind}"] = statistics.fmean(ks)
            diff = [a - b for a, b in zip(vals[c], cov[0][c])]  # paired, question by question, against row 1
            row[f"{c:g}x vs row 1"] = (statistics.fmean(diff), *bootstrap_mean(diff))
            if against:
                diff = [a - b for a, b in zip(vals[c], against["coverage"][f"{c:g}"])]
                row[f"{c:g}x vs against"] = (statistics.fmean(diff), *bootstrap_mean(diff))
        rows.append(row)
    with open(args.out / "grid.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if " vs " not in k}
                    for r in rows)
    cmd = "python benchmarks/paraphrase_tune.py " + " ".join(sys.argv[1:])
    n = len(cov["kinds"])
    lines = [f"made by: `{cmd}`", "",
             f"{args.dataset} {args.split}: {n} questions ({', '.join(f'{k} {v}' for k, v in kinds.items())}); each "
             f"page's relevance: the relevance column (zero: the text parts alone); coverage = share of the answer's "
             f"area in full-resolution cells (best occurrence), strict = coverage >= 0.5, mean over questions; "
             f"'vs row 1': the coverage's paired difference from the first row, question by question, with its 95 % "
             f"bootstrap interval"
             + (f"; 'vs against': the same against the first row of {args.against} (another run's code, the same "
                f"questions: {' '.join(against['command'])})" if against else "") + ".", "",
             "ms per question (mean over the questions of this run, this machine): "
             + ", ".join(f"{k} {statistics.fmean(v):.1f}" for k, v in sorted(ms.items())), "",
             "| " + " | ".join(SETTING) + " | " + " | ".join(f"{c:g}x {m}" for c, m in cols) + " | "
             + " | ".join(f"{c:g}x {k}" for c in args.compression for k in kinds) + " | "
             + " | ".join(f"{c:g}x {p}" for p in pair for c in args.compression) + " |",
             "|" + "---|" * len(SETTING) + "---:|" * (len(cols) + (len(kinds) + len(pair)) * len(args.compression))]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[k]:g}" if isinstance(r[k], float) else str(r[k]) for k in SETTING) + " | "
                     + " | ".join(f"{r[f'{c:g}x {m}']:.3f}" for c, m in cols) + " | "
                     + " | ".join(f"{r[f'{c:g}x {k}']:.3f}" for c in args.compression for k in kinds) + " | "
                     + " | ".join("{:+.3f} [{:+.3f}, {:+.3f}]".format(*r[f"{c:g}x {p}"])
                                  for p in pair for c in args.compression) + " |")
    lines += ["", "The first setting's coverage by the rank its first stage gives the answer's best line (1: the "
              "context's best line; 'no line': no line of the text layer touches the answer):", "",
              "| answer line's rank | n | " + " | ".join(f"{c:g}x coverage" for c in args.compression) + " |",
              "|---|---:|" + "---:|" * len(args.compression)]
    for lo, hi in [*RANK_BUCKETS, (None, None)]:
        pick = [i for i, r in enumerate(cov["ranks"]) if (r is None if lo is None else
                                                          r is not None and r >= lo and (hi is None or r <= hi))]
        label = "no line" if lo is None else str(lo) if lo == hi else f"{lo}-{hi}" if hi else f"> {lo - 1}"
        lines.append(f"| {label} | {len(pick)} | " + " | ".join(
            f"{statistics.fmean(cov[0][c][i] for i in pick):.3f}" if pick else "-" for c in args.compression) + " |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print((args.out / "summary.md").read_text())
    if any(s["oracle"] for s in grid):
        plot_oracle(args, grid, cov)


def plot_oracle(args: argparse.Namespace, grid: list[dict], cov: dict) -> None:
    """oracle.png: the coverage with the answer's lines moved to each rank (the other settings those of the first
    row), the retriever's own order dashed, and the share of questions whose answer line it ranks within each rank."""
    from matplotlib.figure import Figure

    def rest(s: dict) -> dict:  # a setting but its oracle rank
        return {k: v for k, v in s.items() if k != "oracle"}

    same = [i for i, s in enumerate(grid) if rest(s) == rest(grid[0])]
    rows = sorted((grid[i]["oracle"], i) for i in same if grid[i]["oracle"])
    own = next((i for i in same if not grid[i]["oracle"]), None)
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    for n, c in enumerate(args.compression):
        colour = f"C{n}"
        ax.plot([r for r, _ in rows], [statistics.fmean(cov[i][c]) for _, i in rows], "o-", color=colour,
                label=f"{c:g}x, the answer's line moved to the rank")
        if own is not None:
            ax.axhline(statistics.fmean(cov[own][c]), color=colour, ls="--", lw=1,
                       label=f"{c:g}x, the retriever's own order")
    ranked = [r for r in cov["ranks"] if r is not None]
    if rows and cov["ranks"]:
        xs = sorted({1, *range(1, max(r for r, _ in rows) + 1)})
        ax.step(xs, [sum(r <= x for r in ranked) / len(cov["ranks"]) for x in xs], where="post", color="0.4", lw=1,
                label="share of questions whose answer line\nthe retriever ranks within the rank")
    ax.set_xscale("log")
    ax.set_xlabel("rank of the answer's line among the context's lines")
    ax.set_ylabel("coverage of the answer (mean) / share")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{args.dataset} {args.split}: a better line ranking's ceiling", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out / "oracle.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="texlive-paraphrase", choices=["texlive-paraphrase", "texlive-contexts"])
    ap.add_argument("--split", default="val", choices=["train", "val"], help="never test: settings are chosen here")
    ap.add_argument("--docs", type=int, default=10, help="texlive-contexts: documents")
    ap.add_argument("--questions", type=int, default=8, help="texlive-contexts: questions per document")
    ap.add_argument("--limit", type=int, default=None, help="the first N windows")
    ap.add_argument("--start", type=int, default=0, help="skip the first N windows (fill the cache in parallel)")
    ap.add_argument("--cache", type=Path, required=True, help="a folder for the per-window parts (never committed)")
    ap.add_argument("--compression", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--stride", type=int, default=1, choices=[1, 2, 3],
                    help="embed every line's passage (1) or every 2nd / 3rd line's (a line scored by the passages "
                         "it is part of); kept in --cache")
    ap.add_argument("--weight", type=float, nargs="+", default=[RETRIEVAL_WEIGHT])
    ap.add_argument("--top", type=int, nargs="+", default=[RETRIEVAL_TOP])
    ap.add_argument("--bm25", type=float, nargs="+", default=[BM25_WEIGHT],
                    help="BM25 fused into the line scores (0: the retriever's cosine alone)")
    ap.add_argument("--rerank", type=int, nargs="+", default=[0], help="lines the cross-encoder reorders (0: none)")
    ap.add_argument("--text", nargs="+", default=["passage"], choices=["line", "passage"])
    ap.add_argument("--boost", type=float, nargs="+", default=[0.0])
    ap.add_argument("--spread", type=float, nargs="+", default=[SPREAD])
    ap.add_argument("--around", type=int, nargs="+", default=[0], choices=[0, 1])
    ap.add_argument("--front-lines", type=int, nargs="+", default=[FRONT_LINES])
    ap.add_argument("--front-floor", type=float, nargs="+", default=[FRONT_FLOOR])
    for flag, kind, default, text in (
            ("--head", int, LINE_HEAD, "cells from a line's left edge painted at its value (0: the whole line)"),
            ("--tail", float, LINE_TAIL, "the rest of a line (past --head) painted at this times its value, in [0, 1]"),
            ("--typed", float, TYPED_FLOOR,
             "the floor on lines holding the question's answer type (a date, a version, a name; 0: none)"),
            ("--keep", float, RERANK_KEEP,
             "the first stage's standardised score beside the cross-encoder's in its order (0: logits alone)"),
            ("--page-prior", float, PAGE_PRIOR,
             "each line's score plus this times its page's best line's score (0: none)"),
            ("--legible", int, LEGIBLE_SIDE,
             "over several pages a gestalt side below this is sent as 1x1 (0: the square rule alone)"),
            ("--line-mix", float, 0.0,
             "each line's first-stage score: (1 - m) x its passage's cosine + m x its own line's alone "
             "(0: the passage)"),
            ("--heading-mix", float, 0.0,
             "each line's first-stage score: (1 - m) x its passage's cosine + m x its passage's read after its "
             "section heading (0: the passage)"),
            ("--minilm-mix", float, 0.0,
             "each line's first-stage score: (1 - m) x its passage's cosine + m x the passage's cosine under "
             "all-MiniLM-L6-v2, put on bge-small's scale (0: bge-small alone)"),
            ("--refine", int, 0,
             "coarse to fine: lines scored by every third line's passage, then the N best chunks' lines by their own "
             "(0: every line's own passage)"),
            ("--shape-boost", float, SHAPE_BOOST,
             "added to the first-stage score of the lines holding a token of the shape the question names (0: none)"),
            ("--shapes", str, ",".join(SHAPES),
             "comma-separated shapes the boost reads (arr_coc.contexts.answer_types.SHAPES)"),
            ("--rest", float, TOKEN_REST,
             "a line holding words of the shape the question names: the rest of it at this times its value (0: those "
             "words alone; 1: the whole line)"),
            ("--oracle", int, 0,
             "a ceiling, not a setting: the answer's lines moved to this rank of the first stage (0: none)")):
        ap.add_argument(flag, type=kind, nargs="+", default=[default], help=text)
    ap.add_argument("--relevance", nargs="+", default=["zero"], choices=["zero", "ink", "arr"],
                    help="each page's relevance: zero (the text parts alone), ink (its words' cover), arr (the ARR's)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/paraphrase_tune"))
    ap.add_argument("--against", type=Path, default=None,
                    help="another run's per_question.json (e.g. other code, its own --cache): paired columns against "
                         "its first setting")
    args = ap.parse_args()
    if min(args.head) < 0 or not all(0.0 <= t <= 1.0 for t in args.tail):
        ap.error(f"--head takes cells >= 0 and --tail values in [0, 1], got {args.head} and {args.tail}")
    if min(args.oracle) < 0:
        ap.error(f"--oracle takes ranks >= 1 (0: none), got {args.oracle}")
    if max(args.refine) and args.stride != 1:
        ap.error("--refine reads every line's own passage: it needs --stride 1")
    if max(args.rerank) > RERANK_MAX:
        ap.error(f"--rerank reads at most {RERANK_MAX} lines (the cached logits)")
    args.against_run = None  # read before the run, so a wrong file fails now, not after it
    if args.against:
        if not args.against.is_file():
            ap.error(f"--against {args.against}: no such file (a run's per_question.json)")
        args.against_run = json.loads(args.against.read_text())
        missing = [f"{c:g}" for c in args.compression if f"{c:g}" not in args.against_run["coverage"]]
        if missing:
            ap.error(f"--against {args.against} has no coverage at {', '.join(missing)}x: "
                     f"run it with this --compression")
    args.out.mkdir(parents=True, exist_ok=True)
    from arr_coc.engine.retrieval import BgeSmallRetriever, CrossEncoderReranker, load_retriever

    retriever, reranker, canvas = BgeSmallRetriever(), CrossEncoderReranker(), CanvasConfig()
    others = {mix: load_retriever(name) for mix, name in VARIANT_RETRIEVERS.items() if max(getattr(args, mix))}
    arr = None
    if "arr" in args.relevance:  # the eval's default ARR (default channels, MiniLM questions)
        from arr_coc.config import ARRConfig
        from arr_coc.engine.pipeline import ARR
        from arr_coc.engine.query import MiniLMQueryEncoder

        arr = ARR(ARRConfig(), query_encoder=MiniLMQueryEncoder().load()).eval()
        assert arr.config.canvas == canvas, "the tuner's canvas is the ARR's"
    cache = args.cache / f"{args.dataset}-{args.split}"
    grid = [dict(zip(SETTING, v)) for v in itertools.product(
        args.weight, args.top, args.bm25, args.rerank, args.text, args.boost, args.keep, args.spread, args.around,
        args.front_lines, args.front_floor, args.head, args.tail, args.typed, args.page_prior,
        args.legible, args.relevance, args.line_mix, args.heading_mix, args.minilm_mix, args.refine, args.oracle,
        args.shape_boost, args.shapes, args.rest)]
    grid = [s for s in grid if s["shape_boost"] or s["shapes"] == args.shapes[0]]  # shapes read only with a boost
    grid = [s for s in grid if s["rerank"] or (s["text"] == args.text[0] and s["boost"] == args.boost[0]
                                               and s["keep"] == args.keep[0])]
    grid = [s for s in grid if not s["rerank"] or not s["page_prior"]]  # logits cached for the plain first stage
    grid = [s for s in grid if s["front_floor"] or s["front_lines"] == args.front_lines[0]]
    grid = [s for s in grid if not s["rerank"] or s["bm25"] in FIRST_STAGES]  # the reranked first stages cached
    grid = [s for s in grid if s["head"] or s["tail"] == args.tail[0]]  # head 0 paints the whole line: tail unused
    # refinement reads the passages' cosines alone
    grid = [s for s in grid if not (any(s[mix] for mix in VARIANTS) and s["refine"])]
    cov: dict = defaultdict(lambda: defaultdict(list))
    cov["kinds"], cov["ids"], cov["ranks"] = [], [], []
    kinds: dict[str, int] = defaultdict(int)
    ms: dict[str, list[float]] = defaultdict(list)
    wins = list(itertools.islice(windows(args.dataset, args.split, args.docs, args.questions), args.limit))[args.start:]
    for wid, ctx, qs, source in tqdm(wins, desc="windows"):
        win = prepare(wid, ctx, qs, cache, retriever, reranker, canvas, args.stride)
        added = [add_cosines(win, others.get(mix, retriever), key, texts_of)
                 for mix, (key, texts_of) in VARIANTS.items() if max(getattr(args, mix))]
        if any(added):
            torch.save(win, cache / (wid.replace("/", "_").replace("#", "_") + ".pt"))
        found = {"ink": [ink(win, canvas.cell)] * len(qs) if "ink" in args.relevance else None,
                 "arr": arr_relevance(wid, source, qs, cache, arr, win["sizes"], canvas.cell) if arr else None}
        for i, q in enumerate(win["questions"]):
            q["relevance"] = {name: rels[i] for name, rels in found.items() if rels is not None}
        for q, (_, _, _, at, _) in zip(win["questions"], qs):
            q["options"] = canvas_options(win, q, ctx.pages[at].size)
            q["pooled"] = pooled_boxes(q, win["sizes"][at], canvas.cell)
            q["held"] = answer_lines(win, q)  # once per question, not once per setting
            if q["pooled"]:  # the per-cell sum is coc_tune's coverage, computed once per question
                hit = torch.tensor([[0, 0]])
                assert abs(float(q["pooled"][0][0][0, 0]) / q["pooled"][0][1]
                           - coverage(hit, q["options"][0], win["sizes"][at], canvas.cell)) < 1e-5
            cov["kinds"].append(q["kind"])
            cov["ids"].append(q["id"])
            cov["ranks"].append(answer_rank(fused(q, grid[0]["bm25"]), q["at"], q["held"]))
            kinds[q["kind"]] += 1
            for k, v in q["ms"].items():
                ms[k].append(v)
            for i, s in enumerate(grid):
                for c, v in score(win, q, s, canvas.cell, args.compression).items():
                    cov[i][c].append(v)
    write(args, grid, cov, dict(sorted(kinds.items())), ms)


if __name__ == "__main__":
    main()
