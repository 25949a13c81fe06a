"""Training (`arr-coc train`): per-image feature cache, objectives, checkpoints, the loop. Never imports eval.

- :mod:`~arr_coc.train.recipe`: one run's settings (`TrainConfig`) and what it leaves (`Run`).
- :mod:`~arr_coc.train.features`: the cached texture features of every record.
- :mod:`~arr_coc.train.objective`: the learner, its soft selection, the proxy and VLM losses, hard metrics.
- :mod:`~arr_coc.train.checkpoint`: resumable checkpoints and the exported weights.
- :mod:`~arr_coc.train.loop`: the loop itself, in one process or under torchrun.
"""
from __future__ import annotations

from arr_coc.train.checkpoint import export, export_run, export_weights, load_checkpoint, save_checkpoint
from arr_coc.train.loop import batch_indices, plot_history, train
from arr_coc.train.objective import Learner, Objective, hard_metrics
from arr_coc.train.recipe import Run, TrainConfig

__all__ = ["Learner", "Objective", "Run", "TrainConfig", "batch_indices", "export", "export_run", "export_weights",
           "hard_metrics", "load_checkpoint", "plot_history", "save_checkpoint", "train"]
