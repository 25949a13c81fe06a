"""``arr-coc train``: fit the relevance scorer, patch selector or token pruner (texture and VLM frozen)."""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Callable

from arr_coc.cli import options as opt

HELP = "train the relevance scorer, patch selector or token pruner (texture and VLM frozen); runs under torchrun too"


def train_options() -> opt.Options:
    """Every TrainConfig field is a flag of the same name (``--tokens T``, ``--batch-size N``, ...)."""
    from arr_coc.train.loop import TrainConfig

    return {f.name: "--" + f.name.replace("_", "-") for f in fields(TrainConfig)}


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.config import SamplerConfig
    from arr_coc.train.loop import TrainConfig

    p = command("train", [opt.pipeline(canvas=())], help=HELP,
                description="Train the scorer (or --learner selector|pruner) on dataset records split by group "
                            "(one company, form template or image on one side: train / val / test), evaluate on "
                            "held-out images every --eval-every steps, "
                            "checkpoint to OUT/checkpoint.pt (--resume continues exactly; --fresh replaces an earlier "
                            "run), write OUT/<learner>/ (model.safetensors + config.json), "
                            "OUT/metrics.json and OUT/loss.png. Multi-process: "
                            "torchrun --nproc_per_node N -m arr_coc.cli train ...")
    opt.add_options(p.add_argument_group("training"), TrainConfig, train_options())
    opt.add_options(p, SamplerConfig, opt.SAMPLER_NAME_OPTIONS)  # its parameters train too, if it has any
    p.add_argument("--export", default=None, metavar="NAME_OR_PATH",
                   help="publish the trained weights: a name ships them in arr_coc/weights/NAME/ with a registry "
                        "entry (then loadable by that name), a path gets a copy of the folder (a folder already "
                        "holding model.safetensors or config.json is refused before training, unless --fresh)")
    # training starts from the hand-set scorer: any --scorer-weights given would go unused, and is refused
    p.set_defaults(scorer_weights=None)


def run(args: argparse.Namespace) -> int:
    from arr_coc.train.checkpoint import check_export, export
    from arr_coc.train.loop import TrainConfig, train
    from arr_coc.train.recipe import SCORER_WEIGHTS_UNUSED

    if args.scorer_weights not in (None, "none"):
        raise ValueError(SCORER_WEIGHTS_UNUSED.format(args.scorer_weights))
    args.scorer_weights = "none"
    cfg = opt.from_args(TrainConfig, args, train_options())
    if args.export:
        # before any work: a user's files are never overwritten silently, nor an hour's run refused at its end
        check_export(args.export, cfg.fresh, cfg.learner)
    config = opt.arr_config(args, seed=cfg.seed)
    result = train(cfg, config, query_encoder=opt.query_encoder(args, load=False))
    if not result.metrics:  # not rank 0
        return 0
    m = result.metrics
    print(f"examples      {m['examples']}  (split by group; test images never trained on)")
    print(f"tokens        {m['tokens']} of full resolution per example; {m['processes']} process(es); "
          f"{m['train_seconds']:.0f} s")
    for split in ("val", "test"):
        print(f"{split:<5} IoU    initial {m['initial'][split]['iou']:.3f}  learned {m['learned'][split]['iou']:.3f}  "
              f"random {m['random'][split]['iou']:.3f}  |  answer coverage initial "
              f"{m['initial'][split]['coverage']:.3f}  learned {m['learned'][split]['coverage']:.3f}")
    out, weights = Path(cfg.out), Path(cfg.out) / cfg.learner
    print(f"written       {weights}/  {out / 'metrics.json'}  {out / 'loss.png'}  {out / 'checkpoint.pt'}")
    if args.export:
        print(f"exported      {export(weights, args.export, cfg.fresh)}")
    return 0
