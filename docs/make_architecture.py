"""Draws docs/architecture.png: arr_coc's import layers, read from pyproject.toml, and one request's path.

The layers are the import-linter ``layers`` contract (highest first; a module imports only from layers
below its own; siblings joined by "|" are independent, by ":" may import each other). The numbers mark
the modules that ``arr-coc ask IMAGE "question"`` passes through, in order (docs/architecture.md).

    python docs/make_architecture.py [--out docs/architecture.png]
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One request, `arr-coc ask IMAGE "question"`: (step, the diagram's modules it runs in, what happens there).
REQUEST_PATH: list[tuple[str, str, str]] = [
    ("1", "cli", "parse the command (flags from the config dataclasses)"),
    ("2", "vlm", "ask(): load the adapter, run the stages below"),
    ("3", "pipeline", "ARR: see (canvas + texture), gestalt, score, select"),
    ("4", "canvas", "decode the image, smart-resize to the token cell"),
    ("5", "texture channels", "channel stack; OCR text channels from channels/"),
    ("6", "gestalt", "texture pooled on the gestalt grid"),
    ("7", "query", "MiniLM embedding of the question"),
    ("8", "relevance", "three scorers mixed -> relevance map over cells"),
    ("9", "samplers", "top-K: K distinct cells, most relevant first"),
    ("10", "plan", "Plan: gestalt grid + K cells (what is sent)"),
    ("11", "vlm", "adapter encodes the plan, prefill, greedy decode"),
]


def read_layers(pyproject: Path) -> list[list[str]]:
    """The ``layers`` contract of ``pyproject``: one list of short module names per layer, highest first."""
    text = pyproject.read_text()
    block = re.search(r'type = "layers"\s*\nlayers = \[(.*?)\n\]', text, re.S)
    if block is None:
        raise ValueError(f"{pyproject}: no import-linter contract with type = \"layers\"")
    layers = []
    for entry in re.findall(r'"([^"]+)"', block.group(1)):
        layers.append([name.strip().removeprefix("arr_coc.") for name in re.split(r"[|:]", entry)])
    return layers


def independent(pyproject: Path) -> set[str]:
    """Short names of the layer siblings joined by "|" (they never import each other)."""
    text = pyproject.read_text()
    block = re.search(r'type = "layers"\s*\nlayers = \[(.*?)\n\]', text, re.S)
    names = set()
    for entry in re.findall(r'"([^"]+)"', block.group(1) if block else ""):
        if "|" in entry:
            names |= {n.strip().removeprefix("arr_coc.") for n in entry.split("|")}
    return names


def draw(layers: list[list[str]], apart: set[str], out: Path) -> None:
    """One row of boxes per layer, the request's steps numbered on its modules, and their legend."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    steps: dict[str, list[str]] = {}
    for step, modules, _ in REQUEST_PATH:
        for module in modules.split():
            steps.setdefault(module, []).append(step)
    width, row_h, box_h = 10.0, 0.62, 0.44
    fig = Figure(figsize=(15, 0.62 * len(layers) + 1.2))
    ax = fig.add_axes((0.01, 0.02, 0.55, 0.9))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.2, row_h * len(layers) + 0.1)
    ax.axis("off")
    ax.set_title("arr_coc import layers (a module imports only from rows below it)", fontsize=11, loc="left")
    for r, layer in enumerate(layers):
        y = row_h * (len(layers) - 1 - r)
        gap = 0.08
        w = (width - gap * (len(layer) + 1)) / len(layer)
        for i, name in enumerate(layer):
            x = gap + i * (w + gap)
            on_path = name in steps
            ax.add_patch(FancyBboxPatch((x, y), w, box_h, boxstyle="round,pad=0.01,rounding_size=0.05",
                                        facecolor="#fde2cf" if on_path else "#e8eef7",
                                        edgecolor="#c0504d" if on_path else "#5a6f8c",
                                        linestyle="--" if name in apart else "-", linewidth=1.2))
            ax.text(x + w / 2, y + box_h / 2, name, ha="center", va="center", fontsize=9 if w > 1.2 else 7.5)
            if on_path:
                ax.text(x + w - 0.04, y + box_h - 0.04, ",".join(steps[name]), ha="right", va="top",
                        fontsize=7, color="#c0504d", fontweight="bold")
    legend = fig.add_axes((0.58, 0.02, 0.41, 0.9))
    legend.axis("off")
    legend.set_title('one request: arr-coc ask IMAGE "question"', fontsize=11, loc="left")
    lines = [f"{step:>2}  {modules.split()[0]:<10} {what}" for step, modules, what in REQUEST_PATH]
    lines += ["", "dashed boxes: siblings that never import each other", "orange: on the request's path"]
    legend.text(0.0, 0.97, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=8.5)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png")
    args = ap.parse_args()
    pyproject = ROOT / "pyproject.toml"
    draw(read_layers(pyproject), independent(pyproject), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
