"""A linear map on bge-small's question vectors, learned from the hand-written train questions; judged on validation.

    python benchmarks/query_adapter.py --cache /tmp/qadapt --out benchmarks/results/paraphrase/query_adapter_val.md \\
        --lam 0.1 0.3 1 3 --tau 0.05 --steps 100 --rank 0 16

For every ``texlive-paraphrase`` question of the ``train`` split (250, over 42 train manuals) and of ``val`` (199)
each line of its window's text layer is read as its passage (:func:`arr_coc.contexts.ranking.passage_texts`, at
100 dpi on the canvas, as the ranking reads it) and embedded by bge-small, kept in ``--cache``; a line *holds the
answer* when it touches an occurrence of it (the tuner's :func:`paraphrase_tune.answer_lines`). A map W (384 x 384,
``--rank`` 0: full, else I + U V^T of that rank) turns a question's vector q into normalise(W q); it is fitted on the
train questions alone (Adam, ``--steps`` full-batch steps from W = I) to put the answer's lines first among all the
window's lines (softmax over the window at temperature ``--tau``, minus the log of the answer lines' share, plus
``--lam`` x ||W - I||^2). Reported for each setting: the rank of the answer's best line among its window's lines
(1 = first; a tie counts against it) as recall at 1 / 5 / 10 / 20 / 64 / 192, on train (what was fitted) and on
val (unseen), with how many val questions the map moved up and down. The test questions are never read.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch
from emit import emit  # the benchmark beside this one (a script's folder is on its path)
from paraphrase_tune import answer_lines, answer_rank, canvas_options, embed_pages, window_canvas, windows
from tqdm import tqdm

from arr_coc.config import CanvasConfig
from arr_coc.contexts.ranking import passage_texts
from arr_coc.engine.retrieval import BgeSmallRetriever

KS = (1, 5, 10, 20, 64, 192)


def collect(split: str, cache: Path) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Each window's passage vectors [L, D] by window id, and each question's vector, window and answer lines."""
    path = cache / f"{split}.pt"
    if path.is_file():
        return torch.load(path, weights_only=False)
    retriever, canvas = BgeSmallRetriever(), CanvasConfig()
    vectors, items = {}, []
    for wid, ctx, qs, _ in tqdm(list(windows("texlive-paraphrase", split, 0, 0)), desc=f"{split} windows"):
        sizes, _, lines = window_canvas(ctx, canvas)
        win, texts = {"sizes": sizes, "lines": lines}, [passage_texts(ls) for ls in lines]
        vectors[wid] = torch.cat([e for e in embed_pages(retriever, texts) if e is not None])
        starts = [0, *itertools.accumulate(map(len, texts))]
        for qid, question, _, at, options in qs:
            found = {"at": at, "options": options}
            found["options"] = canvas_options(win, found, ctx.pages[at].size)
            held = [starts[at] + i for i in answer_lines(win, found)]
            items.append({"id": qid, "q": retriever.queries([question])[0], "wid": wid, "held": held})
    cache.mkdir(parents=True, exist_ok=True)
    torch.save((vectors, items), path)
    return vectors, items


def mapped(q: torch.Tensor, W: torch.Tensor | None) -> torch.Tensor:
    """A question's vector under the map W, normalised (None: the vector as it is)."""
    return q if W is None else torch.nn.functional.normalize(W @ q, dim=0)


def ranks(vectors: dict[str, torch.Tensor], items: list[dict], W: torch.Tensor | None) -> list[int]:
    """The rank of each question's best answer line among its window's lines (a tie counts against it)."""
    return [answer_rank([vectors[it["wid"]] @ mapped(it["q"], W)], 0, it["held"]) for it in items]


def fit(vectors: dict[str, torch.Tensor], items: list[dict], lam: float, tau: float, steps: int, rank: int,
        seed: int = 0) -> torch.Tensor:
    """W fitted on ``items``: the answer lines' softmax share over the window, ``lam`` x ||W - I||^2 beside it."""
    gen = torch.Generator().manual_seed(seed)
    eye = torch.eye(next(iter(vectors.values())).shape[1])
    if rank:
        U = torch.zeros(len(eye), rank, requires_grad=True)
        V = (torch.randn(len(eye), rank, generator=gen) * 0.01).requires_grad_()
        params, make = [U, V], lambda: eye + U @ V.T
    else:
        full = eye.clone().requires_grad_()
        params, make = [full], lambda: full
    opt = torch.optim.Adam(params, lr=1e-3)
    for _ in range(steps):
        opt.zero_grad()
        W = make()
        loss = lam * ((W - eye) ** 2).sum()
        for it in items:
            s = vectors[it["wid"]] @ mapped(it["q"], W) / tau
            loss = loss + (torch.logsumexp(s, 0) - torch.logsumexp(s[it["held"]], 0)) / len(items)
        loss.backward()
        opt.step()
    return make().detach()


def recall(r: list[int]) -> str:
    return " | ".join(f"{100 * sum(x <= k for x in r) / len(r):.1f}" for k in KS) + f" | {statistics.median(r):g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, required=True, help="a folder for the embedded windows (never committed)")
    ap.add_argument("--lam", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0])
    ap.add_argument("--tau", type=float, nargs="+", default=[0.05])
    ap.add_argument("--steps", type=int, nargs="+", default=[100])
    ap.add_argument("--rank", type=int, nargs="+", default=[0])
    ap.add_argument("--out", type=Path, default=None, help="markdown file for the table")
    args = ap.parse_args()
    train_v, train = collect("train", args.cache)
    val_v, val = collect("val", args.cache)
    train = [it for it in train if it["held"]]
    val = [it for it in val if it["held"]]
    head = " | ".join(f"R@{k}" for k in KS)
    lines = [f"Made by: `python benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}`", "",
             f"Questions with an answer line: train {len(train)}, val {len(val)} (recall in % of them; med: median "
             f"rank).", "", f"| map | split | {head} | med | val up / down |", "|---|---|" + "---:|" * (len(KS) + 2)]
    base = ranks(val_v, val, None)
    lines += [f"| none | train | {recall(ranks(train_v, train, None))} | |", f"| none | val | {recall(base)} | |"]
    for lam, tau, steps, rank in tqdm(list(itertools.product(args.lam, args.tau, args.steps, args.rank)),
                                      desc="settings"):
        W = fit(train_v, train, lam, tau, steps, rank)
        got = ranks(val_v, val, W)
        up, down = sum(g < b for g, b in zip(got, base)), sum(g > b for g, b in zip(got, base))
        name = f"lam {lam:g}, tau {tau:g}, {steps} steps, {'full' if not rank else f'rank {rank}'}"
        lines += [f"| {name} | train | {recall(ranks(train_v, train, W))} | |",
                  f"| {name} | val | {recall(got)} | {up} / {down} |"]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
