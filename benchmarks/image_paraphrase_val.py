"""How the single-image text channels' line scoring reads on the image-paraphrase VALIDATION questions, at 11 %.

For each question (receipts and forms of the validation split, never the test split) the eval's own code reads
(Tesseract, the answer box + 8 px) what each view shows: full resolution, the uniform image at 11 % of the
tokens, arr's gestalt alone, and arr's view (gestalt + saccades, its ``topk`` sampler) with the text channels'
lines scored by MiniLM's cosine (``rerank`` off) and by the cross-encoder (``rerank`` on), the same scene and
relevance scorer otherwise. ``--shares`` adds a gestalt of the canvas's aspect holding that share of the 11 %
(the rest as saccades of the default scoring), alone and with its saccades. ``--legible``: arr as the eval runs
it under the gestalt rule for legible text (:func:`arr_coc.budget.legible_gestalt`) and under the square rule.
Prints per-kind means of the reading (ANLS) and the saccades' coverage of the answer, the aggregates only.

``--lines``: instead, where the line holding the answer ranks among the page's RapidOCR lines (the text channels'
own lines; a line holds the answer when over 30 % of its box lies in an answer box) by MiniLM's cosine and by the
cross-encoder: recall@1 and @5 per kind.

Every mode places arr's saccades on the relevance alone, as the eval did when these were chosen; the eval now adds
the image's own lines' retrieval (``contexts.allocate.image_placing``, chosen by ``benchmarks/image_placing_val.py``).

`arr-coc eval --split val` refuses this split (the shipped scorer weights were chosen on it), so this script
calls the eval's parts directly: its figures choose the text scoring, and are no held-out result.

    python benchmarks/image_paraphrase_val.py [--limit N] [--kinds receipt] [--shares 0.5 0.75] [--lines]
    python benchmarks/image_paraphrase_val.py --legible [--budget 25%]   # the rule against the square rule
    python benchmarks/image_paraphrase_val.py --rule-grid [--budget 25%]  # choosing it
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from arr_coc import ARR
from arr_coc.allocators.methods import build_samplers
from arr_coc.budget import LEGIBLE_SHARE, LEGIBLE_TEXT_PX, Budget, downsampled_grid, legible_gestalt
from arr_coc.data.boxes import scale_boxes
from arr_coc.data.image_paraphrase import load_image_paraphrase
from arr_coc.engine.channels.text import text_heights
from arr_coc.engine.views import downsampled_view, foveated_view, gestalt_view
from arr_coc.eval.metrics import best_window
from arr_coc.eval.reading import make_view_reader, read_region
from arr_coc.eval.run import allocation_rows
from arr_coc.eval.settings import EvalSettings

BUDGET = "11%"
MARGIN = 8  # px around the answer box, the eval's default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="the first N validation questions")
    ap.add_argument("--kinds", default="", help="only kinds starting with this (receipt, form)")
    ap.add_argument("--shares", type=float, nargs="*", default=[], help="gestalt shares of the budget to try")
    ap.add_argument("--lines", action="store_true", help="rank the answer's OCR line instead of reading")
    ap.add_argument("--aspect", action="store_true",
                    help="only the square gestalt against one of the canvas's aspect with at most its tokens (same K)")
    ap.add_argument("--legible", action="store_true",
                    help="only arr under the gestalt rule for legible text (the default) against the square rule")
    ap.add_argument("--budget", default=BUDGET, help="the budget (a share of full resolution)")
    ap.add_argument("--rule-grid", action="store_true",
                    help="choose the legible-gestalt rule: every image's reading at gestalt shares 0.3-0.9 of its "
                         "aspect, then each (min px, share) rule over them")
    args = ap.parse_args()
    if args.lines:
        return report(line_ranks(args.kinds, args.limit))
    arr = ARR.from_pretrained("contextual").eval()  # what `arr-coc eval` builds by default: the same config and weights
    settings = EvalSettings(methods=["arr"], budgets=[args.budget], reader="tesseract", reading="region", seed=0,
                            margin_px=MARGIN)
    reader, samplers = make_view_reader("tesseract", "region"), build_samplers(["arr"])
    options = arr.config.texture.options
    records = [r for r in load_image_paraphrase(split="val") if r.kind.startswith(args.kinds)][: args.limit]
    by_image = defaultdict(list)
    for r in records:
        by_image[r.image].append(r)
    rows = []

    def read(view, record, target) -> float:
        return best_window(read_region(reader, view, target, MARGIN), record.answer)[0]

    for image, questions in by_image.items():
        with torch.no_grad():
            scene = arr.see(image)
            vector = arr.gestalt(scene, 1).vector
            canvas, cell = scene.canvas, scene.canvas.cell
            hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
            pixels = canvas.pixels[0, :, : hc * cell, : wc * cell]
            total = Budget.parse(args.budget).total(canvas.full_tokens[0])
            (grid,), _ = Budget.parse(total).split([(hc, wc)])
            for r in questions:
                target = scale_boxes(r.boxes_px, canvas.scales[0])
                if args.rule_grid:
                    rows.append(share_row(arr, scene, vector, r, pixels, target, total, read, samplers, reader,
                                          settings))
                    continue
                if args.legible:
                    rows.append(legible_row(arr, scene, vector, r, pixels, target, total, read, samplers, reader,
                                            settings))
                    continue
                if args.aspect:
                    rows.append(aspect_row(arr, scene, vector, r, pixels, target, grid, total, read))
                    continue
                row = {"kind": r.kind, "full": read(pixels, r, target),
                       "uniform": read(downsampled_view(pixels, total, cell)[0], r, target),
                       "gestalt": read(gestalt_view(pixels, cell, grid), r, target)}
                for name, rerank in (("minilm", False), ("cross-encoder", True)):
                    for channel in ("text_match", "key_value"):
                        options.setdefault(channel, {})["rerank"] = rerank
                    relevance, query_emb = arr.score(scene, [r.question], vector)
                    out = next(x for x in allocation_rows(r, canvas, relevance.map, query_emb, samplers, reader,
                                                          settings, arr=arr) if x["method"] == "arr")
                    row[name], row[name + " coverage"] = out["reading"], out["coverage"]
                for channel in ("text_match", "key_value"):
                    options[channel].pop("rerank")
                relevance, query_emb = arr.score(scene, [r.question], vector)
                for share in args.shares:
                    g = downsampled_grid(hc, wc, max(1, int(total * share)))
                    k = total - g[0] * g[1]
                    pos = arr.select(relevance.map, k, valid=canvas.valid, query_emb=query_emb).positions[0]
                    row[f"gestalt {share:g}"] = read(foveated_view(pixels, pos[:0], cell, g), r, target)
                    row[f"gestalt {share:g} + saccades"] = read(foveated_view(pixels, pos, cell, g), r, target)
                rows.append(row)
    if args.rule_grid:
        return rule_grid(rows)
    report(rows)


GRID_SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
GRID_PX = (6.0, 8.0, 9.0, 10.0, 11.0, 12.0)


def share_row(arr, scene, vector, r, pixels, target, total, read, samplers, reader, settings) -> dict:
    """One question's reading under the square rule (the eval's arr), the uniform image, full resolution and a
    gestalt of the canvas's aspect holding each of GRID_SHARES of the total with the default scoring's top K as
    saccades; with the image's text height as the rule reads it (:func:`text_heights`)."""
    canvas, cell = scene.canvas, scene.canvas.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    relevance, query_emb = arr.score(scene, [r.question], vector)
    out = next(x for x in allocation_rows(r, canvas, relevance.map, query_emb, samplers, reader, settings, arr=arr)
               if x["method"] == "arr")
    row = {"kind": r.kind, "full": read(pixels, r, target), "square rule": out["reading"],
           "uniform": read(downsampled_view(pixels, total, cell)[0], r, target),
           "height": text_heights(arr, scene)[0], "cells": (hc, wc), "total": total}
    for share in GRID_SHARES:
        g = downsampled_grid(hc, wc, max(1, int(total * share)))
        pos = arr.select(relevance.map, total - g[0] * g[1], valid=canvas.valid, query_emb=query_emb).positions[0]
        row[share] = read(foveated_view(pixels, pos, cell, g), r, target)
    return row


def rule_grid(rows: list[dict]) -> None:
    """Each rule (min px, share): an image whose lines stay min px tall in the gestalt of that share reads it,
    the others the square rule; the mean reading overall and per kind, best first."""
    kinds = sorted({r["kind"] for r in rows})
    print(f"full {sum(r['full'] for r in rows) / len(rows):.3f}, uniform {sum(r['uniform'] for r in rows) / len(rows):.3f}")
    print("| rule | all | " + " | ".join(kinds) + " |")
    print("|---|---:|" + "---:|" * len(kinds))
    results = [("square rule", [r["square rule"] for r in rows])]
    for px in GRID_PX:
        for share in GRID_SHARES:
            results.append((f"{px:g} px, share {share:g}",
                            [r[share] if legible_gestalt(r["cells"], r["total"], r["height"], share, px) else
                             r["square rule"] for r in rows]))
    default = next(r for r in results if r[0] == f"{LEGIBLE_TEXT_PX:g} px, share {LEGIBLE_SHARE:g}")
    for name, got in sorted(results, key=lambda x: -sum(x[1]))[:20] + [(default[0] + " (the default)", default[1]),
                                                                          results[0]]:
        print(f"| {name} | {sum(got) / len(got):.3f} | " + " | ".join(
            f"{sum(v for v, r in zip(got, rows) if r['kind'] == k) / sum(r['kind'] == k for r in rows):.3f}"
            for k in kinds) + " |")


def legible_row(arr, scene, vector, r, pixels, target, total, read, samplers, reader, settings) -> dict:
    """arr as the eval runs it, under the gestalt rule for legible text (its lines' median height from the text
    channels) and under the square rule alone (no height), with full resolution and the uniform image."""
    relevance, query_emb = arr.score(scene, [r.question], vector)
    height = text_heights(arr, scene)[0]
    row = {"kind": r.kind, "full": read(pixels, r, target),
           "uniform": read(downsampled_view(pixels, total, scene.canvas.cell)[0], r, target)}
    for name, h in (("square rule", None), ("legible rule", height)):
        out = next(x for x in allocation_rows(r, scene.canvas, relevance.map, query_emb, samplers, reader, settings,
                                              arr=arr, text_height=h) if x["method"] == "arr")
        row[name], row[name + " coverage"] = out["reading"], out["coverage"]
    hc, wc = (s // scene.canvas.cell for s in scene.canvas.sizes[0])
    row["legible gestalt"] = float(legible_gestalt((hc, wc), total, height) is not None)
    return row


def aspect_row(arr, scene, vector, r, pixels, target, grid, total, read) -> dict:
    """The square gestalt (the token rule's) and one of the canvas's aspect with at most as many tokens, each alone
    and with the same saccades (the default scoring's top K, K = the 11 % minus the square gestalt's tokens)."""
    hc, wc = pixels.shape[-2] // scene.canvas.cell, pixels.shape[-1] // scene.canvas.cell
    aspect = downsampled_grid(hc, wc, grid[0] * grid[1])
    relevance, query_emb = arr.score(scene, [r.question], vector)
    pos = arr.select(relevance.map, total - grid[0] * grid[1], valid=scene.canvas.valid, query_emb=query_emb)
    pos, cell = pos.positions[0], scene.canvas.cell
    return {"kind": r.kind, "square": read(gestalt_view(pixels, cell, grid), r, target),
            "square + saccades": read(foveated_view(pixels, pos, cell, grid), r, target),
            "aspect": read(gestalt_view(pixels, cell, aspect), r, target),
            "aspect + saccades": read(foveated_view(pixels, pos, cell, aspect), r, target),
            "aspect tokens / square": aspect[0] * aspect[1] / (grid[0] * grid[1])}


def line_ranks(kinds: str, limit: int | None) -> list[dict]:
    """Per question the answer line's recall@1 / @5 among the image's OCR lines, by MiniLM and the cross-encoder."""
    import numpy as np
    from PIL import Image

    from arr_coc.engine.channels.text import detect_lines
    from arr_coc.engine.query import MiniLMQueryEncoder
    from arr_coc.engine.retrieval import cross_encoder

    encoder, lines, rows = MiniLMQueryEncoder(), {}, []
    for r in [r for r in load_image_paraphrase(split="val") if r.kind.startswith(kinds)][:limit]:
        if r.image_id not in lines:
            rgb = np.asarray(Image.open(r.image).convert("RGB"))
            lines[r.image_id] = detect_lines(torch.from_numpy(rgb.copy()).permute(2, 0, 1).float() / 255, encoder)
        tl = lines[r.image_id]
        b, lb = torch.tensor(r.boxes_px), tl.boxes_px  # [N, 4], [L, 4] (y0, x0, y1, x1) px
        dy = (torch.minimum(lb[:, None, 2], b[None, :, 2]) - torch.maximum(lb[:, None, 0], b[None, :, 0])).clamp_min(0)
        dx = (torch.minimum(lb[:, None, 3], b[None, :, 3]) - torch.maximum(lb[:, None, 1], b[None, :, 1])).clamp_min(0)
        area = ((lb[:, 2] - lb[:, 0]) * (lb[:, 3] - lb[:, 1])).clamp_min(1)
        answer = ((dy * dx).sum(1) / area > 0.3).nonzero().flatten().tolist()
        legible = tl.legible.nonzero().flatten().tolist()
        cross = torch.full((len(tl),), -torch.inf)
        if legible:
            cross[legible] = cross_encoder().rerank(r.question, [tl.texts[i] for i in legible])
        row = {"kind": r.kind}
        for name, s in (("minilm", tl.emb @ encoder.encode([r.question])[0]), ("cross-encoder", cross)):
            order = s.argsort(descending=True).tolist()
            rank = min((order.index(a) + 1 for a in answer), default=len(order) + 1)  # no answer line: a miss
            row[name + " R@1"], row[name + " R@5"] = float(rank <= 1), float(rank <= 5)
        rows.append(row)
    return rows


def report(rows: list[dict]) -> None:
    cols = [c for c in rows[0] if c != "kind"]
    groups = defaultdict(list)
    for row in rows:
        groups["all"].append(row)
        groups[row["kind"]].append(row)
    print("| kind (n) | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for kind in sorted(groups, key=lambda k: (k != "all", k)):
        got = groups[kind]
        means = [sum(g[c] for g in got) / len(got) for c in cols]
        print(f"| {kind} ({len(got)}) | " + " | ".join(f"{m:.3f}" for m in means) + " |")


if __name__ == "__main__":
    main()
