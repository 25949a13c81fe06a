"""What an evaluation runs: one settings class for every record kind (images, contexts) and reader.

``methods`` are names of the one method registry (:mod:`arr_coc.allocators.methods`) as the reader's tables
spell them; ``budgets`` are parsed once here (:meth:`arr_coc.budget.Budget.parse`): a token count (``529``), a
share of full resolution (``"25%"``) or, over contexts, a compression of the text (``"10x"``). A row's ``budget``
column holds the budget as asked (``"25%"``, ``"529"``; a compression as ``"10x"``; ``"full"`` for a method with
one plan), so result folders and the committed tables stay valid.

Left as None, ``methods``, ``budgets`` and ``margin_px`` take the defaults of the records' scope and the reader
(:meth:`EvalSettings.resolve`, which the evaluation loop calls once it knows what its records are).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from arr_coc.allocators.methods import METHODS, SCOPE_NAMES, methods_for
from arr_coc.budget import Budget
from arr_coc.config import MAX_NEW_TOKENS, check_float, check_int
from arr_coc.data.datasets import SHORT_ANSWER_PROMPT
from arr_coc.eval.reading import READERS, READINGS

OCR_READERS = ("tesseract", "rapidocr")
SCOPES = ("image", "context")
MARGIN_PX = {"image": 8, "context": 4.0}  # px around the answer box when reading: a field / one text line
DEFAULT_BUDGETS = {("image", "ocr"): ("5%", "10%", "25%", "50%"),  # shares of the full canvas
                   ("image", "vlm"): ("256", "529", "1024"),  # 8x8 + 192, 16x16 + 273, 16x16 + 768
                   ("context", "ocr"): ("10x", "20x"), ("context", "vlm"): ("10x", "20x")}
VLM_DEFAULT_METHODS = ("full", "native_budget", "arr", "slice")
NO_BUDGET = "name at least one method and one budget (--tokens, or --compression over contexts)"
PROMPT = SHORT_ANSWER_PROMPT  # every dataset's default template (DatasetSpec.prompt)


def known_methods(reader: str | None, scope: str | None = None) -> tuple[str, ...]:
    """The methods ``reader`` can send over ``scope`` (both scopes when None), in table order."""
    kind = "vlm" if reader == "vlm" else "ocr"
    scopes = SCOPES if scope is None else (scope,)
    return tuple(dict.fromkeys(m for s in scopes for m in methods_for(kind, scope=s)))


def default_methods(reader: str | None, scope: str) -> tuple[str, ...]:
    """What a run evaluates unless told otherwise."""
    if reader == "vlm":
        return VLM_DEFAULT_METHODS if scope == "image" else known_methods("vlm", "context")
    return methods_for("ocr", default=True, scope=scope)


def budget_label(spec: Any, budget: Budget) -> str:
    """How rows key a budget: a compression as ``10x``, a count or share as asked.

    >>> budget_label(" 25% ", Budget.parse("25%")), budget_label("10.0x", Budget.parse("10.0x")), budget_label(529, Budget.parse(529))
    ('25%', '10x', '529')
    """
    return str(budget) if budget.kind == "text" or isinstance(spec, Budget) else str(spec).strip()


@dataclass
class EvalSettings:
    """What an evaluation runs: ``methods`` at every budget of ``budgets``, read by ``reader`` (None: the
    allocation metrics only), over images or contexts (see the module docstring)."""

    methods: Sequence[str] | None = None
    budgets: Sequence[str | int | Budget] | None = None
    reader: str | None = "tesseract"  # tesseract, rapidocr (OCR readers), vlm (the model answers), None
    reading: str = "region"  # READINGS, OCR over images: "region" reads the answer box + margin, "find" the view
    seed: int = 0  # subset choice, random baseline, stochastic samplers (per record)
    margin_px: float | None = None  # px around the answer box when reading (None: MARGIN_PX of the scope)
    patch_options: dict | None = None  # keyword options of the patchers, e.g. {"size_prior": 2.0}
    learned: dict | None = None  # weights of "selector" / "pruner" (default: the packaged ones)
    keep_cells: bool = False  # rows also hold the chosen cells ("cells": [[y, x], ...]) of the cell methods
    fresh: bool = False  # replace rows of an output folder made with other settings (else: refuse)
    # contexts: the ranking's weights (None: the context allocation's) and how the contexts were made
    text_weight: float | None = None
    page_weight: float | None = None
    contexts: dict = field(default_factory=dict)
    # the VLM reader
    batch_size: int = 8  # answers generated together (left-padded prompts)
    max_new_tokens: int = MAX_NEW_TOKENS  # short answers; a longer answer is cut, and scored as cut
    prompt: str = PROMPT  # "{question}" is replaced by the record's question
    layout: str = "scaled"  # saccade positions (arr_coc.vlm.LAYOUTS)
    model: str = ""  # the model's name, written in every row
    scope: str | None = None  # "image" or "context" once resolved

    def __post_init__(self) -> None:
        if isinstance(self.methods, str) or isinstance(self.budgets, (str, int, Budget)):
            raise TypeError("methods and budgets are lists, e.g. methods=('topk',), budgets=('25%',)")
        if self.reader is not None and self.reader != "vlm":
            READERS.get(self.reader)  # fail now, not after the first record
        known = known_methods(self.reader, self.scope)
        unknown = [m for m in self.methods or () if m not in known]
        if unknown:
            raise ValueError(f"unknown methods {unknown}{' for the vlm reader' if self.reader == 'vlm' else ''}; "
                             f"known: {', '.join(known)}")
        if self.methods is not None and not self.methods:
            raise ValueError("name at least one method")
        if self.budgets is not None and not self.budgets and set(self.methods or ("topk",)) != {"full"}:
            raise ValueError(NO_BUDGET)
        if self.budgets is not None:
            parsed = [Budget.parse(b) for b in self.budgets]
            self.budgets = tuple(dict.fromkeys(budget_label(s, b) for s, b in zip(self.budgets, parsed)))
        if self.reading not in READINGS:
            raise ValueError(f"unknown reading {self.reading!r}; choose one of {', '.join(READINGS)}")
        self.seed = check_int("seed", self.seed, 0)
        if self.margin_px is not None and not (math.isfinite(self.margin_px) and self.margin_px >= 0):
            raise ValueError(f"--margin must be >= 0 px, got {self.margin_px}")
        if (self.patch_options or {}).get("size_prior") is not None:
            check_float("size_prior", self.patch_options["size_prior"], strict=False)
        for name, w in self.weights().items():
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite weight >= 0, got {w}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(f"batch size and max new tokens must be positive, got {self.batch_size}, "
                             f"{self.max_new_tokens}")
        if self.reader == "vlm":
            from arr_coc.vlm.processing import check_prompt

            check_prompt(self.prompt)

    def resolve(self, scope: str) -> "EvalSettings":
        """These settings for records of ``scope`` (``image`` or ``context``): defaults filled in, methods and
        budgets checked against what such records can take."""
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
        kind = "vlm" if self.reader == "vlm" else "ocr"
        methods = tuple(self.methods or default_methods(self.reader, scope))
        wrong = [m for m in methods if m not in known_methods(self.reader, scope)]
        if wrong:
            what = "a whole context" if scope == "context" else "one image"
            raise ValueError(f"methods {wrong} do not send {what}{' to the vlm reader' if kind == 'vlm' else ''}; "
                             f"choose from {', '.join(known_methods(self.reader, scope))}")
        budgets = self.budgets if self.budgets is not None else DEFAULT_BUDGETS[scope, kind]
        once = [m for m in methods if not METHODS.get(_entry(m, scope)).per_tokens]
        if not budgets and len(once) < len(methods):
            raise ValueError(NO_BUDGET)
        if scope == "image" and any(Budget.parse(b).needs_text for b in budgets):
            raise ValueError(f"budgets {[b for b in budgets if Budget.parse(b).needs_text]} are compressions of a "
                             f"context's text; images take a token count or a share (e.g. 529, 25%)")
        margin = MARGIN_PX[scope] if self.margin_px is None else self.margin_px
        return replace(self, methods=methods, budgets=tuple(budgets), margin_px=margin, scope=scope)

    def parsed(self) -> dict[str, Budget]:
        """Each budget label with its :class:`Budget`."""
        return {b: Budget.parse(b) for b in self.budgets or ()}

    def wanted(self) -> list[tuple[str, str]]:
        """(method, budget) pairs of a record: the methods with one plan ("full") once, the others per budget."""
        scope = self.scope or "image"
        once = [(m, "full") for m in self.methods if not METHODS.get(_entry(m, scope)).per_tokens]
        return once + [(m, b) for b in self.budgets for m in self.methods if METHODS.get(_entry(m, scope)).per_tokens]

    def keys(self, record_id: str) -> set[tuple[str, str, str]]:
        """The row keys one record (one question) asks for."""
        return {(record_id, m, b) for m, b in self.wanted()}

    def weights(self) -> dict[str, float]:
        """The context ranking's weights given (the others are the context allocation's)."""
        return {k: v for k, v in (("text_weight", self.text_weight), ("page_weight", self.page_weight)) if v is not None}


def _entry(name: str, scope: str) -> str:
    """The registry name of a method as ``scope``'s tables spell it (over a context, ``uniform``)."""
    return SCOPE_NAMES.get(scope, {}).get(name, name)
