"""Every metric of the evaluation: where the saccades landed (box coverage) and whether the answer was right.

Answer metrics (``ANSWER_METRICS``, named by ``Record.metric`` and ``DatasetSpec.metric``; one entry
point, :func:`answer_score`): ``anls`` (DocVQA, InfoVQA; FUNSD, SROIE, JSONL answers),
``contains`` (ANLS against the best word window: the OCR reading score, whose crop holds neighbouring
words), ``vqa_accuracy`` (TextVQA: 10 annotators, the VQA normalisation) and ``relaxed_accuracy`` (ChartQA).

Boxes are ``(y0, x0, y1, x1)`` in canvas pixels (``arr_coc.data.boxes.scale_boxes`` with ``Canvas.scales``); ``chosen`` is a
``[Hc, Wc]`` bool map of the full-resolution saccade cells. Areas are measured exactly: a box
covers each pixel by the fraction of the pixel inside it, and a union of boxes takes the per-pixel
maximum (exact for boxes on pixel edges, a tight lower bound otherwise).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Callable, Sequence, Union

import torch
from rapidfuzz.distance import Levenshtein
from torch import Tensor

from arr_coc.data.boxes import Box, box_mask


def cells_to_pixels(chosen: Tensor, cell: int) -> Tensor:
    """[Hc, Wc] bool cells -> [Hc*cell, Wc*cell] float64 pixel mask."""
    return chosen.to(torch.float64).repeat_interleave(cell, 0).repeat_interleave(cell, 1)


def covered_fraction(region: Tensor, chosen_px: Tensor) -> float:
    """Share of ``region``'s area (a fractional pixel mask) inside the chosen pixels; NaN for an empty region."""
    area = float(region.sum())
    return float((region * chosen_px).sum()) / area if area > 0 else float("nan")


@dataclass
class Coverage:
    """Per-record allocation metrics (all in [0, 1]; NaN where a region is empty)."""

    coverage: float  # share of the answer-box area inside saccade cells
    hit: float  # 1.0 when coverage >= 0.5
    iou: float  # training's proxy: IoU of the chosen cells and the cells the answer touches
    secondary: float  # coverage of the other answers of the same image (not the target)
    peripheral: float  # coverage of everything else

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def allocation_metrics(chosen: Tensor, cell: int, target: Sequence[Box], others: Sequence[Box] = (),
                       hit_threshold: float = 0.5) -> Coverage:
    """Coverage, hit, IoU proxy and region-wise coverage (does every region keep some saccades?) of one image's saccades.

    Args:
        chosen: [Hc, Wc] bool, the saccade cells (the canvas is Hc*cell x Wc*cell px).
        cell: token cell in px.
        target: the question's answer boxes, canvas px (y0, x0, y1, x1).
        others: the other answers' boxes on the same image, canvas px.

    Example:
        >>> chosen = torch.zeros(4, 4, dtype=torch.bool); chosen[0, 0] = chosen[0, 1] = True
        >>> m = allocation_metrics(chosen, 10, [(0, 0, 10, 40)], [(30, 30, 40, 40)])
        >>> m.coverage, m.hit, m.iou, m.secondary, round(m.peripheral, 4)
        (0.5, 1.0, 0.5, 0.0, 0.0)
    """
    hc, wc = chosen.shape
    height, width = hc * cell, wc * cell
    chosen_px = cells_to_pixels(chosen, cell)
    t = box_mask(target, height, width)
    o = (box_mask(others, height, width) - t).clamp(min=0)  # secondary excludes what is also the target
    rest = (1 - torch.maximum(t, o)).clamp(min=0)
    cov = covered_fraction(t, chosen_px)
    answer_cells = torch.nn.functional.avg_pool2d(t[None, None], cell)[0, 0] > 0  # [Hc, Wc]
    union = int((answer_cells | chosen).sum())
    iou = int((answer_cells & chosen).sum()) / union if union else float("nan")
    return Coverage(coverage=cov, hit=float(cov >= hit_threshold) if cov == cov else float("nan"), iou=iou,
                    secondary=covered_fraction(o, chosen_px), peripheral=covered_fraction(rest, chosen_px))


# ----------------------------------------------------------------------------- answer metrics
def normalize_text(s: str) -> str:
    """Casefolds, collapses runs of whitespace to one space and strips.

    Example:
        >>> normalize_text("  Total\\n  42.00 ")
        'total 42.00'
    """
    return " ".join(s.casefold().split())


def _nls(prediction: str, answer: str, tau: float) -> float:
    """1 - normalised Levenshtein distance of already-normalised strings, 0 when it reaches tau."""
    longest = max(len(prediction), len(answer))
    if longest == 0:
        return 1.0  # both empty: nothing to read and nothing read
    nl = Levenshtein.distance(prediction, answer) / longest
    return 1.0 - nl if nl < tau else 0.0


def anls(prediction: str, answers: Union[str, Sequence[str]], tau: float = 0.5) -> float:
    """Average Normalized Levenshtein Similarity of one prediction (Biten et al. 2019, ST-VQA / DocVQA).

    After ``normalize_text``, NL = Levenshtein distance / max(len(prediction), len(answer)); the score
    is max over answers of 1 - NL if NL < tau else 0. Averaging over questions is the caller's.
    Edge cases: both empty -> 1.0; empty prediction vs a non-empty answer (and the reverse) -> 0.0.

    Example:
        >>> anls("TOTAL", "total"), anls("42.0O", "42.00"), anls("4", "42.00"), anls("", "")
        (1.0, 0.8, 0.0, 1.0)
        >>> anls("21/11/2026", ["21/11/26", "21/11/2026"])
        1.0
    """
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise ValueError("anls needs at least one ground-truth answer")
    p = normalize_text(prediction)
    return max(_nls(p, normalize_text(a), tau) for a in answers)


def contains_score(prediction: str, answer: Union[str, Sequence[str]], tau: float = 0.5) -> float:
    """ANLS of the answer against the best contiguous word window of the prediction (the reading score).

    An OCR crop holds the answer region plus a margin, so the reading may contain neighbouring
    words ("Date: 21/11/2026" for the answer "21/11/2026"). The score is the best ``anls`` of the
    answer against every window of n - 1, n or n + 1 consecutive words of the prediction (n = words in
    the answer; the +-1 absorbs OCR splitting or merging a token) and against the whole prediction,
    so it is never below ``anls(prediction, answer)``. The evaluation harness reports this as the
    reading score; plain ``anls`` stays available. An empty answer falls back to plain ``anls``.
    With several answers the best counts.

    Example:
        >>> contains_score("Date: 21/11/2026", "21/11/2026"), anls("Date: 21/11/2026", "21/11/2026")
        (1.0, 0.625)
        >>> contains_score("TOTAL 42.0O due", "42.00"), contains_score("the TOTAL 42.00 due", "total 42.00")
        (0.8, 1.0)
        >>> contains_score("", "42.00"), contains_score("Total: 9.00", ["9,00", "9.00"])
        (0.0, 1.0)
    """
    return best_window(prediction, answer, tau)[0]


def best_window(prediction: str, answer: Union[str, Sequence[str]], tau: float = 0.5) -> tuple[float, str]:
    """:func:`contains_score` and the text that scored it: the best word window, or the whole prediction.

    What the ``find`` reading keeps of a whole view's OCR: the span that counted, not the page.

    Example:
        >>> best_window("CASH 10.00 TOTAL 9.00 CHANGE 1.00", "total 9.00")
        (1.0, 'total 9.00')
        >>> best_window("nothing here", "9.00")
        (0.0, 'nothing here')
    """
    if not isinstance(answer, str):
        answers = list(answer)
        if not answers:
            raise ValueError("contains_score needs at least one ground-truth answer")
        return max((best_window(prediction, a, tau) for a in answers), key=lambda found: found[0])
    a = normalize_text(answer)
    words = normalize_text(prediction).split()
    n = len(a.split())
    best = (anls(prediction, answer, tau), prediction)
    if n == 0:
        return best
    for m in range(max(1, n - 1), min(n + 1, len(words)) + 1):
        for i in range(len(words) - m + 1):
            window = " ".join(words[i : i + m])
            score = _nls(window, a, tau)
            if score > best[0]:
                best = (score, window)
    return best


# The VQA evaluation's answer normalisation (Antol et al. 2015, vqaEval.py), used by TextVQA.
_VQA_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't", "dont": "don't",
    "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't", "havent": "haven't",
    "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd", "howll": "how'll",
    "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd",
    "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't",
    "mustve": "must've", "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've",
    "she'dve": "she'd've", "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've", "somebodyll": "somebody'll",
    "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's", "thered": "there'd",
    "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're", "theres": "there's", "theyd": "they'd",
    "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've",
    "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't",
    "whatll": "what'll", "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's",
    "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're",
    "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll",
    "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd",
    "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}
_VQA_NUMBERS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
                "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_VQA_ARTICLES = ("a", "an", "the")
_VQA_PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")  # a period not followed by a digit (the official pattern, as written)
_COMMA_NUMBER = re.compile(r"(\d)(,)(\d)")


def vqa_normalize(text: str) -> str:
    """The VQA answer normalisation: punctuation, lower case, number words to digits, no articles, contractions.

    Example:
        >>> vqa_normalize("The Two dogs!"), vqa_normalize("dont"), vqa_normalize("1,000"), vqa_normalize("3.5 ft.")
        ('2 dogs', "don't", '1000', '3.5 ft')
    """
    text = text.replace("\n", " ").replace("\t", " ").strip()
    out = text
    for p in _VQA_PUNCT:
        if p + " " in text or " " + p in text or _COMMA_NUMBER.search(text):
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    out = _PERIOD.sub("", out)
    words = [_VQA_NUMBERS.get(w, w) for w in out.lower().split()]
    return " ".join(_VQA_CONTRACTIONS.get(w, w) for w in words if w not in _VQA_ARTICLES)


def vqa_accuracy(prediction: str, answers: str | Sequence[str]) -> float:
    """VQA accuracy: min(#matching annotators / 3, 1), averaged over the leave-one-out subsets of the answers.

    With the usual 10 answers, each of the 10 subsets of 9 counts; prediction and answers are compared
    after :func:`vqa_normalize`.

    Example:
        >>> vqa_accuracy("Two", ["2"] * 10), vqa_accuracy("stop", ["stop"] * 2 + ["go"] * 8)
        (1.0, 0.6)
        >>> round(vqa_accuracy("stop", ["stop"] * 3 + ["go"] * 7), 4), vqa_accuracy("yield", ["stop"] * 10)
        (0.9, 0.0)
    """
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise ValueError("vqa_accuracy needs at least one ground-truth answer")
    if len(answers) == 1:  # one reference: no subsets to leave out, a plain match
        return float(vqa_normalize(prediction) == vqa_normalize(answers[0]))
    p = vqa_normalize(prediction)
    same = [vqa_normalize(a) == p for a in answers]
    hits = sum(same)
    return sum(min((hits - s) / 3, 1.0) for s in same) / len(answers)


def _number(text: str) -> float | None:
    """ChartQA's number reading: a float, a percentage as a fraction, else None."""
    try:
        return float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        return None


def relaxed_accuracy(prediction: str, answers: str | Sequence[str], tolerance: float = 0.05) -> float:
    """ChartQA's relaxed accuracy: a number within ``tolerance`` relative error, otherwise an exact match.

    Exact means equal after stripping and lower-casing; a target of 0 or a non-number is compared
    exactly. The best over the answers counts.

    Example:
        >>> relaxed_accuracy("10.4", "10"), relaxed_accuracy("10.6", "10"), relaxed_accuracy(" Yes", "yes")
        (1.0, 0.0, 1.0)
        >>> relaxed_accuracy("12%", "0.12"), relaxed_accuracy("0.0", "0"), relaxed_accuracy("0", "0")
        (1.0, 0.0, 1.0)
    """
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise ValueError("relaxed_accuracy needs at least one ground-truth answer")
    p = prediction.strip()
    best = 0.0
    for a in (a.strip() for a in answers):
        pv, av = _number(p), _number(a)
        if pv is not None and av:
            ok = abs(pv - av) / abs(av) <= tolerance
        else:
            ok = p.lower() == a.lower()
        best = max(best, float(ok))
    return best


ANSWER_METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "anls": anls, "contains": contains_score, "vqa_accuracy": vqa_accuracy, "relaxed_accuracy": relaxed_accuracy}


def answer_score(metric: str, prediction: str, answers: Sequence[str]) -> float:
    """Score a predicted answer with a benchmark's metric (``ANSWER_METRICS``: the records' ``metric``).

    >>> answer_score("anls", "Total", ["total"]), answer_score("relaxed_accuracy", "51", ["50"])
    (1.0, 1.0)
    >>> answer_score("contains", "Total: 9.00", ["9.00"]), answer_score("anls", "Total: 9.00", ["9.00"])
    (1.0, 0.0)
    """
    if metric not in ANSWER_METRICS:
        raise ValueError(f"unknown answer metric {metric!r}; known: {', '.join(ANSWER_METRICS)}")
    return ANSWER_METRICS[metric](prediction, answers)
