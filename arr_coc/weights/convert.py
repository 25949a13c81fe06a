"""``python -m arr_coc.weights.convert``: older ``.pt`` weights into folders of ``model.safetensors`` + ``config.json``.

With no argument it converts every shipped entry still held as a ``.pt`` file (``registry.json`` is
rewritten, the ``.pt`` removed, the file it came from recorded as ``converted_from``); with paths it
converts those files into folders beside them (``run/scorer.pt`` -> ``run/scorer/``) or under
``--out``. Every conversion is checked before the ``.pt`` goes: the folder reads back to the same
tensors, bit for bit, and the same settings.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Sequence

import torch

from arr_coc.errors import UserError, WeightsError
from arr_coc.weights.catalog import PACKAGED, entries, publish
from arr_coc.weights.files import LEARNED_FORMAT, SCORER_FORMAT, load_file
from arr_coc.weights.folders import STATE_DICTS, read_weights, save_folder

FORMATS = (SCORER_FORMAT, LEARNED_FORMAT)
WHAT = "weights made by `arr-coc train`"


def convert_file(src: str | Path, out: str | Path | None = None) -> Path:
    """Convert one ``.pt`` weights file into a folder (default: beside it, without the suffix); returns the folder."""
    src = Path(src)
    folder = Path(out) if out is not None else src.with_suffix("")
    if folder.exists() and not folder.is_dir():
        raise WeightsError(f"{folder} exists and is not a folder; pass another --out")
    save_folder(load_file(src, FORMATS, WHAT), folder)
    check_same(src, folder)
    return folder


def convert_registry(root: Path | None = None) -> list[str]:
    """Convert every registry entry still held as a ``.pt`` file; returns one line per entry converted."""
    root = root or PACKAGED
    done = []
    for name, entry in entries(root).items():
        if not entry.file.endswith(".pt"):
            continue
        src = root / entry.file
        with warnings.catch_warnings():  # this is the conversion the deprecation asks for
            warnings.simplefilter("ignore", FutureWarning)
            publish(src, name, root=root)
        check_same(src, root / name)
        src.unlink()
        done.append(f"{name}: {entry.file} -> {name}/ (model.safetensors + config.json)")
    return done


def check_same(src: Path, folder: Path) -> None:
    """The folder holds exactly the ``.pt`` file's tensors (bit for bit) and settings (as JSON reads them)."""
    old, new = load_file(src, FORMATS, WHAT), read_weights(folder, FORMATS, WHAT)
    for group in STATE_DICTS[old["format"]]:
        a, b = old[group], new[group]
        same = a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
        if not same:
            raise WeightsError(f"{folder}: its {group} tensors differ from {src}'s; the conversion is not kept")
    rest = {k: v for k, v in old.items() if k not in STATE_DICTS[old["format"]]}
    mine = {k: v for k, v in new.items() if k not in STATE_DICTS[old["format"]] and k != "converted_from"}
    if json.loads(json.dumps(rest, default=str)) != mine:
        raise WeightsError(f"{folder}: its config differs from {src}'s settings; the conversion is not kept")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arr_coc.weights.convert", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", type=Path, help=".pt weights files (default: every shipped .pt entry)")
    p.add_argument("--out", type=Path, default=None, help="the folder to write (one path only)")
    p.add_argument("--registry", type=Path, default=None, help=argparse.SUPPRESS)  # another registry (tests)
    args = p.parse_args(argv)
    if args.out is not None and len(args.paths) != 1:
        p.error("--out takes exactly one path")
    try:
        if args.paths:
            for src in args.paths:
                print(f"{src} -> {convert_file(src, args.out)}")
        else:
            lines = convert_registry(args.registry)
            print("\n".join(lines) if lines else "every shipped entry is a folder already")
    except (UserError, ValueError, OSError) as err:
        print(f"convert: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

