"""The lmms-eval model ``arr_coc``: a frozen VLM answering benchmark questions from gestalt + saccades.

Installed with ``pip install arr-coc[lmms]``, the package registers this model in lmms-eval's
``lmms_eval.models`` entry-point group (``pyproject.toml``), so lmms-eval's own command runs it::

    lmms-eval --model arr_coc --model_args pretrained=Qwen/Qwen2.5-VL-7B-Instruct,tokens=529,relevance=vlm \\
        --tasks docvqa_val,chartqa

``model_args`` (``key=value``, comma separated):

* ``pretrained``: what :func:`arr_coc.vlm.load_vlm` takes: a checkpoint folder, a hub id or ``tiny:<family>``.
* ``tokens``: the total T sent per image (``529`` or a share of full resolution, ``25%``), split on each
  image's own cell grid into gestalt + saccades by :meth:`arr_coc.budget.Budget.split` before the image is read
  (the square rule: ``arr-coc eval`` and ``ask --tokens`` also give an image whose print stays legible a larger
  gestalt, from its text lines); or ``saccades``: K per image with the gestalt of the token rule
  (default: K = 273, i.e. 16x16 + 273 = 529 tokens on a page of at least 16 cells a side).
* ``relevance``: ``auto`` (default), ``arr`` or ``vlm``; ``mode``, ``layout``, ``allocator``: as ``ask``.
* ``dtype``, ``device``: as ``ask`` (lmms-eval's ``--device`` lands in ``device``).

Only ``generate_until`` is served, greedily, one request at a time (``--batch_size 1``); tasks that score
log-likelihoods, sample, use beams, show several images or none are refused with a one-line reason.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmms_eval.models.registry_v2 import ModelManifest

MODEL_ID = "arr_coc"


# Defined before this module imports lmms_eval: importing lmms_eval.models loads every entry point, this
# one included, so when this module is imported first its entry point must already resolve (a missing
# attribute there is dropped silently by lmms-eval's registry and `--model arr_coc` would be unknown).
def manifest() -> ModelManifest:
    """What lmms-eval's registry loads from the ``lmms_eval.models`` entry point: ``--model arr_coc``."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=f"{__name__}.ArrCoc")


from dataclasses import replace  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from lmms_eval.api.instance import Instance  # noqa: E402
from lmms_eval.api.model import lmms  # noqa: E402

from arr_coc.budget import Budget  # noqa: E402
from arr_coc.config import ARRConfig, GestaltConfig, check_int  # noqa: E402

OPTIONS = ("pretrained", "tokens", "saccades", "relevance", "mode", "layout", "allocator", "dtype", "device",
           "batch_size", "max_batch_size")


class ArrCoc(lmms):
    """lmms-eval's view of :func:`arr_coc.vlm.answer` at a token budget (see the module docstring)."""

    is_simple = True

    def __init__(self, pretrained: str, tokens: Any = None, saccades: Any = None, relevance: str = "auto",
                 mode: str = "sparse", layout: str = "scaled", allocator: str = "arr", dtype: Any = None,
                 device: Any = None, batch_size: Any = 1, max_batch_size: Any = None, **unknown: Any) -> None:
        super().__init__()
        from arr_coc.engine.query import MiniLMQueryEncoder
        from arr_coc.vlm import load_vlm
        from arr_coc.vlm.allocation import default_relevance

        if unknown:
            raise ValueError(f"arr_coc model_args: unknown {', '.join(sorted(unknown))}; known: {', '.join(OPTIONS)}")
        if str(batch_size) != "1":
            raise ValueError(f"arr_coc answers one request at a time (each image has its own gestalt grid); "
                             f"use --batch_size 1, got {batch_size!r}")
        if tokens is not None and saccades is not None:
            raise ValueError("arr_coc model_args: give tokens=T (gestalt + saccades) or saccades=K, not both")
        # the request's budget, parsed once here: a bad count or share fails now, not at the first request
        self.budget = None if tokens is None else Budget.parse(str(tokens))
        if self.budget is not None and self.budget.needs_text:
            raise ValueError(f"arr_coc model_args: tokens={tokens} is a compression of a context's text; a task's "
                             f"images take a token count (529) or a share of full resolution (25%)")
        self.saccades = None if saccades is None else check_int("saccades", saccades)
        self.vlm = load_vlm(str(pretrained), dtype=dtype, device=device)
        self.relevance = default_relevance(self.vlm) if relevance == "auto" else relevance
        self.mode, self.layout, self.allocator = mode, layout, allocator
        # the vlm source reads the question with the VLM itself: MiniLM then never loads
        self.encoder = MiniLMQueryEncoder().load() if self.relevance != "vlm" else MiniLMQueryEncoder()
        self._arrs: dict[tuple[int, int] | None, Any] = {}  # one ARR per gestalt grid, built when first needed

    def _arr(self, grid: tuple[int, int] | None) -> Any:
        from arr_coc.engine.pipeline import ARR

        if grid not in self._arrs:
            config = ARRConfig(gestalt=GestaltConfig(grid=grid))
            config = replace(config, canvas=replace(config.canvas, cell=self.vlm.cell))
            self._arrs[grid] = ARR(config, query_encoder=self.encoder).eval().to(self.vlm.device)
        return self._arrs[grid]

    def _budget(self, image: Any) -> tuple[Any, int]:
        """(the ARR with this image's gestalt grid, K): ``tokens`` split on the image's own cell grid."""
        if self.budget is None:
            arr = self._arr(None)
            return arr, self.saccades or arr.config.sampler.saccades
        from arr_coc.engine.canvas import make_canvas

        canvas = self._arr(None).config.canvas
        c = make_canvas(image, cell=self.vlm.cell, min_pixels=canvas.min_pixels, max_pixels=canvas.max_pixels)
        (grid,), k = self.budget.split([tuple(s // c.cell for s in c.sizes[0])])
        return self._arr(grid), k

    def answer(self, image: Any, question: str, max_new_tokens: int) -> Any:
        """One :class:`arr_coc.vlm.answer.Answer` at this model's budget."""
        from arr_coc.vlm import ask

        arr, k = self._budget(image)
        with torch.inference_mode():
            return ask(self.vlm, image, question, arr=arr, saccades=k, mode=self.mode, layout=self.layout,
                       allocator=self.allocator, relevance=self.relevance, max_new_tokens=max_new_tokens)

    def generate_until(self, requests: list[Instance]) -> list[str]:
        out = []
        for req in requests:
            context, gen_kwargs, doc_to_visual, doc_id, task, split = req.args
            visuals = doc_to_visual(self.task_dict[task][split][doc_id])
            if not visuals or len(visuals) != 1:
                raise ValueError(f"arr_coc answers about exactly one image per question; task {task!r} gives "
                                 f"{len(visuals or [])}")
            until = _greedy(gen_kwargs, task)
            text = self.answer(visuals[0], context.replace("<image>", "").strip(),
                               int(gen_kwargs.get("max_new_tokens", 32))).text
            for stop in until:  # lmms-eval's stop strings: the answer ends before the first one
                text = text.split(stop)[0] if stop else text
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    def loglikelihood(self, requests: list[Instance]) -> list[tuple[float, bool]]:
        raise NotImplementedError("arr_coc generates answers only (generate_until); this task scores "
                                  "log-likelihoods, which arr_coc does not compute")

    def generate_until_multi_round(self, requests: list[Instance]) -> list[str]:
        raise NotImplementedError("arr_coc answers single-round questions only (generate_until)")


def _greedy(gen_kwargs: dict[str, Any], task: str) -> list[str]:
    """The task's stop strings; a task asking to sample or search beams is refused (arr_coc decodes greedily)."""
    if gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature") or 0) > 0 or \
            int(gen_kwargs.get("num_beams") or 1) > 1:
        raise ValueError(f"task {task!r} asks for sampling or beam search ({gen_kwargs}); arr_coc decodes greedily")
    until = gen_kwargs.get("until") or []
    return [until] if isinstance(until, str) else list(until)
