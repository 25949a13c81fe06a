"""The learned allocators' table of docs/allocators.md, from the shipped weights themselves.

    python benchmarks/learner_table.py

Every weights folder `arr-coc train --export` writes records the metrics its training run measured on
the held-out test images of the group splits (``metrics`` in config.json: top-K of the learned map at
the training budget against the answer; :func:`arr_coc.train.hard_metrics`), and the training time.
This prints them for the shipped selector, pruner and contextual scorer, beside random cells, so the
table always describes the weights that ship. The scorer's own training time is its training run's
(benchmarks/results/train/metrics.json): its folder was exported from a finished run.
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "arr_coc" / "weights"
LEARNERS = (("selector", "selector (pixels only)"), ("pruner", "pruner (tokens + question)"),
            ("contextual", "contextual scorer (the shipped default)"))


def metrics(name: str) -> dict:
    m = json.loads((WEIGHTS / name / "config.json").read_text())["metrics"]
    return {**m, "examples": m["examples"]["test"], "learned": m["learned"]["test"], "random": m["random"]["test"]}


def seconds(name: str, m: dict) -> float:
    if name == "contextual":  # exported with --resume from the run that trained it
        return json.loads((ROOT / "benchmarks" / "results" / "train" / "metrics.json").read_text())["train_seconds"]
    return m["train_seconds"]


def table() -> str:
    first = metrics(LEARNERS[0][0])
    tokens, n, rand = first["tokens"], first["examples"], first["random"]
    lines = [f"| learner (test images, {n} questions, top-K at {tokens}) | answer IoU | answer area covered "
             f"| train time (s, CPU) |", "|---|---:|---:|---:|",
             f"| random cells | {rand['iou']:.3f} | {rand['coverage']:.3f} | |"]
    for name, label in LEARNERS:
        m = metrics(name)
        if (m["tokens"], m["examples"]) != (tokens, n):
            raise SystemExit(f"{name} was measured at {m['tokens']} on {m['examples']} questions, not {tokens} on {n}")
        lines.append(f"| {label} | {m['learned']['iou']:.3f} | {m['learned']['coverage']:.3f} | "
                     f"{seconds(name, m):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
