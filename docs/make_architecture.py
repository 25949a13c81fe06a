"""Draws docs/architecture.png: arr_coc's import layers, read from pyproject.toml, the imports between its
top-level packages, and one request's path; prints the same import graph as a mermaid block.

The layers are the import-linter ``layers`` contract (highest first; a module imports only from layers
below its own; siblings joined by "|" are independent, by ":" may import each other). The arrows are the
imports between top-level packages (``arr_coc.X``), read from the code by grimp (import-linter's own
graph), with every arrow implied by a longer path left out (transitive reduction). The numbers mark the
packages that ``arr-coc ask IMAGE "question"`` passes through, in order (docs/architecture.md).

    python docs/make_architecture.py [--out docs/architecture.png] [--mermaid]
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One request, `arr-coc ask IMAGE "question"`: (step, the diagram's packages it runs in, what happens there).
REQUEST_PATH: list[tuple[str, str, str]] = [
    ("1", "cli", "parse the command (flags from the config dataclasses), the budget parsed once"),
    ("2", "vlm contexts", "ask(): load the adapter; the image a one-page context (contexts.allocate_images)"),
    ("3", "engine", "ARR (engine/pipeline.py): see (canvas + texture), gestalt, score, select"),
    ("4", "engine", "canvas.py: decode the image, smart-resize to the token cell"),
    ("5", "engine ocr", "texture.py: channel stack; OCR text channels from engine/channels/"),
    ("6", "budget engine", "the gestalt rule; gestalt.py pools the texture on its grid"),
    ("7", "engine", "query.py: MiniLM embedding of the question"),
    ("8", "engine", "relevance.py: three scorers mixed -> relevance map over cells"),
    ("9", "engine", "samplers.py: top-K: K distinct cells, most relevant first"),
    ("10", "engine", "plan.py: Plan: gestalt grid + K cells (what is sent)"),
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


def import_graph(package: str = "arr_coc") -> set[tuple[str, str]]:
    """(importer, imported) between the top-level modules of ``package`` (``arr_coc.engine.texture`` counts as
    ``engine``), every direct import, the package's own ``__init__`` (a facade re-exporting ARR and the configs)
    left out."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None)
    edges = set()
    for module in graph.modules:
        parts = module.split(".")
        for imported in graph.find_modules_directly_imported_by(module) if len(parts) > 1 else ():
            other = imported.split(".")
            if len(other) > 1 and other[1] != parts[1]:
                edges.add((parts[1], other[1]))
    return edges


def reduce(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges that no longer path implies (transitive reduction): ``a -> c`` goes where ``a -> b -> c`` exists."""
    out = set(edges)
    for a, c in sorted(edges):
        rest = out - {(a, c)}
        seen, todo = set(), [b for x, b in rest if x == a]
        while todo:
            b = todo.pop()
            if b not in seen:
                seen.add(b)
                todo += [y for x, y in rest if x == b]
        if c in seen:
            out.discard((a, c))
    return out


def upward(edges: set[tuple[str, str]], layers: list[list[str]], pyproject: Path) -> list[tuple[str, str]]:
    """The edges the layers forbid: into a higher layer, into a name no layer holds, or between "|" siblings."""
    row = {name: r for r, layer in enumerate(layers) for name in layer}
    apart = independent(pyproject)
    return sorted((a, b) for a, b in edges
                  if a not in row or b not in row or row[a] > row[b] or (row[a] == row[b] and {a, b} <= apart))


def mermaid(edges: set[tuple[str, str]], layers: list[list[str]]) -> str:
    """A mermaid flowchart of ``edges``, highest layer first, one arrow a line."""
    row = {name: r for r, layer in enumerate(layers) for name in layer}
    lines = ["```mermaid", "flowchart TB"]
    lines += [f"    {a} --> {b}" for a, b in sorted(edges, key=lambda e: (row.get(e[0], 99), e[0], row.get(e[1], 99), e[1]))]
    return "\n".join(lines + ["```"])


def draw(layers: list[list[str]], apart: set[str], out: Path, edges: set[tuple[str, str]] = frozenset()) -> None:
    """One row of boxes per layer, ``edges`` as arrows from importer to imported, the request's steps
    numbered on its packages, and their legend."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    steps: dict[str, list[str]] = {}
    for step, modules, _ in REQUEST_PATH:
        for module in modules.split():
            steps.setdefault(module, []).append(step)
    width, row_h, box_h = 10.0, 0.9, 0.44
    fig = Figure(figsize=(16, 0.9 * len(layers) + 1.2))
    ax = fig.add_axes((0.01, 0.02, 0.55, 0.9))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.2, row_h * len(layers) + 0.1)
    ax.axis("off")
    ax.set_title("arr_coc: import layers (rows) and imports between packages (arrows, importer -> imported)",
                 fontsize=11, loc="left")
    boxes: dict[str, tuple[float, float, float]] = {}  # name -> (x, y, w)
    for r, layer in enumerate(layers):
        y = row_h * (len(layers) - 1 - r)
        gap = 0.25
        w = min(2.2, (width - gap * (len(layer) + 1)) / len(layer))
        # a lone package zigzags (left, centre, right, centre) so that an arrow over several rows passes beside
        # the boxes between, not through them
        shift = (-2.6, 0.0, 2.6, 0.0)[r % 4] if len(layer) == 1 else 0.0
        left = (width - len(layer) * w - (len(layer) - 1) * gap) / 2 + shift
        for i, name in enumerate(layer):
            x = left + i * (w + gap)
            boxes[name] = (x, y, w)
            on_path = name in steps
            ax.add_patch(FancyBboxPatch((x, y), w, box_h, boxstyle="round,pad=0.01,rounding_size=0.05",
                                        facecolor="#fde2cf" if on_path else "#e8eef7", zorder=2,
                                        edgecolor="#c0504d" if on_path else "#5a6f8c",
                                        linestyle="--" if name in apart else "-", linewidth=1.2))
            ax.text(x + w / 2, y + box_h / 2, name, ha="center", va="center", fontsize=9, zorder=3)
            if on_path:
                ax.text(x + w - 0.04, y + box_h - 0.04, ",".join(steps[name]), ha="right", va="top",
                        fontsize=7, color="#c0504d", fontweight="bold", zorder=3)
    for a, b in sorted(edges):
        if a in boxes and b in boxes:
            (xa, ya, wa), (xb, yb, wb) = boxes[a], boxes[b]
            ax.add_patch(FancyArrowPatch((xa + wa / 2, ya), (xb + wb / 2, yb + box_h), arrowstyle="-|>",
                                         mutation_scale=8, color="#7f8c9d", linewidth=0.7, zorder=1,
                                         connectionstyle="arc3,rad=0.12"))
    legend = fig.add_axes((0.58, 0.02, 0.41, 0.9))
    legend.axis("off")
    legend.set_title('one request: arr-coc ask IMAGE "question"', fontsize=11, loc="left")
    lines = [f"{step:>2}  {modules.split()[0]:<8} {what}" for step, modules, what in REQUEST_PATH]
    lines += ["", "arrows: direct imports between packages, those implied", "by a longer path left out",
              "dashed boxes: siblings that never import each other", "orange: on the request's path"]
    legend.text(0.0, 0.97, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=8.5)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png")
    ap.add_argument("--mermaid", action="store_true", help="print the import graph as docs/architecture.md's block")
    args = ap.parse_args()
    pyproject = ROOT / "pyproject.toml"
    layers, edges = read_layers(pyproject), reduce(import_graph())
    if args.mermaid:
        print(mermaid(edges, layers))
        return
    draw(layers, independent(pyproject), args.out, edges)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
