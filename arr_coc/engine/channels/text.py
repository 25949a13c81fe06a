"""Text channels: lines that say what the question asks (``text_match``) and where their values sit (``key_value``).

Image part (once per image and query encoder, cached under ``"text_lines:..."``): RapidOCR (PP-OCR
detection + recognition, ONNX models shipped in the wheel, offline) finds the text lines of the page and
reads them; each legible line's text is embedded by the pipeline's query encoder (the same MiniLM as the
questions), giving :class:`TextLines`. A line read as ``"Key: value"`` or ``"Key --- value"`` (see
:func:`split_key_value`) is stored as two pieces, its box split in proportion to the characters, because OCR
often joins a form's key and its value into one line ("Date:9/3/92") and the channels must tell them apart.

Question part (per question): a score ``s_l`` of each line for the question (:func:`line_scores`): the cosine
similarity of the line's and the question's embeddings (cheap: the lines are embedded once per image). Option
``rerank`` (True) of either channel has the cross-encoder ms-marco-MiniLM-L-12-v2
(:class:`~arr_coc.engine.retrieval.CrossEncoderReranker`, offline) read each (question, line) pair instead, its
logits scaled to [0, 1] over the image's lines. Off by default: on the validation questions in a user's words it read 0.779 against 0.765 (within
the interval) for a model run per line and question, and the shipped scorer was trained on the cosine maps
(docs/coc.md, "One image").

* ``text_match`` paints each line box with ``max(s_l, 0)`` (overlaps take the max) and scales the image's
  best line to 1: "this line says what the question says".
* ``key_value`` paints the place a line's VALUE usually occupies (right of it on its row, or just below it),
  weighted by the sharpened similarity of the line as a key: "the answer to this key is here". The key's
  own box gets nothing from itself, so the map peaks on the value, not on the key.

Measured on 207 FUNSD questions (15 forms; the question entity's text, e.g. "Date:", as the question; its
linked answer box as the target; maps pooled to 28 px cells): the top cell of ``key_value`` lies on the
answer for 60 % of the questions (the centre of its top painted box for 65 %), that of ``text_match`` for 6 %
(it lands on the question's own key for 80 %), a random cell for 1.4 %. On the first 50 questions: 62 %,
6 % and 1.8 %.

Illegible lines (recognition confidence below ``MIN_SCORE`` or no text) keep their boxes but get no
embedding (a zero row), hence similarity 0: they never match a question themselves, but they are detected
lines that ``key_value`` can lift as a value (handwritten or faint values are often illegible to OCR).
Text presence as such is already in the ``edges`` / ``highpass`` channels, so no constant is added for it.

Cost, paid once per image and then cached (2-core x86 CPU, onnxruntime's default threads, median of 3;
another job was using part of the CPU): the receipt example (992x1484 px, 45 lines) 1.8 s, FUNSD forms
(762x1000 px, 26 and 93 lines) 2.4-2.6 s, of which detection 0.6-0.7 s and recognition the rest (every line is
resized to 48 px high). A long-side limit of 736 px instead of 960 saves ~0.3 s of detection but found 79 of
the 93 lines of the dense form. On a fully loaded CPU the same pages took 4-8 s.

Example:
    >>> from arr_coc.engine.query import HashingQueryEncoder
    >>> from arr_coc.engine.texture import compute_texture
    >>> tex = compute_texture(torch.ones(1, 3, 56, 84), ("text_match", "key_value"), queries=["What is the total?"],
    ...                       query_encoder=HashingQueryEncoder())
    >>> tuple(tex.shape), float(tex.abs().sum())  # a blank page: no lines, zero maps
    ((1, 2, 56, 84), 0.0)
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.budget import LEGIBLE_MIN_LINES
from arr_coc.engine.channel_registry import FLAT_RANGE, TextureInputs, register_channel
from arr_coc.engine.imageops import paint_boxes, to_hwc_uint8  # noqa: F401  (paint_boxes re-exported)
from arr_coc.engine.retrieval import cross_encoder
from arr_coc.ocr import DET_LIMIT_SIDE_LEN, TEXT_SCORE, rapidocr_engine, require_rapidocr

# Lines recognised below RapidOCR's own cut-off are mostly wrong characters: their embedding would match
# questions at random, so they mark where text is without being matched.
MIN_SCORE = TEXT_SCORE
# The short side, in detector pixels, below which a thin image is padded (see _pad_for_detection).
MIN_DETECTED_SIDE = 48
# the text channels' ``ocr`` option (:func:`ocr_backend`)
OCR_BACKENDS = ("auto", "onnxruntime", "torch")
# key_value geometry, in units of the key line's height h. Values on forms often sit at a tab stop far right
# of their key (a column of keys at x ~70 px, their values at ~400 px on FUNSD forms: 10-13 h). On 207 FUNSD
# questions the top cell hit the answer 42 / 54 / 55 / 55 % of the time with a reach of 4 / 12 / 16 / 24 h.
RIGHT_REACH = 16.0
# A value written under its key starts within about one blank line (two line heights) below it.
BELOW_REACH = 2.0
# Right of a key is the usual place of its value on forms and receipts; below is second, and the line below a
# key is often just the next key of a list. On the same FUNSD questions (reach 16 h), weights 0.7 / 0.6 / 0.5 /
# 0.4 put the top 28 px cell on the answer 55 / 60 / 61 / 62 % of the time and the centre of the top painted
# box in it 66 / 65 / 60 / 60 % (at or below GAP_WEIGHT the gap ties with the line below); 1.0 gave 33 %.
BELOW_WEIGHT = 0.6
# The empty stretch between a key and its value is painted weaker than a detected line there, so the map
# peaks on the text of the value; where no line was detected (a faint value), the stretch itself peaks.
GAP_WEIGHT = 0.5
# Two boxes are on one text row when their vertical overlap is at least half the smaller height.
ROW_OVERLAP = 0.5
# "Key: value" or "Key --- value": the first colon after a non-digit ("Time: 14:37" splits at "Time:", "14:37"
# does not split), or the first run of two or more leaders (-, _, .), the dashes and dots forms print between
# a key and its value ("Closures--- Standard Blue").
_KEY_VALUE = re.compile(r"^(.*?[^\d\s])(:|\s*[-_.]{2,})\s*([^\s\-_.].*)$")


@dataclass(frozen=True)
class TextLines:
    """The text lines of one image: boxes, readings and their embeddings (question-free).

    Attributes:
        boxes_px: ``[L, 4]`` (y0, x0, y1, x1) in the image's pixels, float32 (the canvas the channel sees).
        texts: the L recognised texts ("" where nothing was read).
        scores: ``[L]`` recognition confidence in [0, 1].
        legible: ``[L]`` bool, score >= ``MIN_SCORE`` and non-empty text.
        emb: ``[L, D]`` L2-normalised text embeddings; zero rows for illegible lines.
    """

    boxes_px: Tensor
    texts: tuple[str, ...]
    scores: Tensor
    legible: Tensor
    emb: Tensor

    def __len__(self) -> int:
        return len(self.texts)


def split_key_value(text: str) -> tuple[str, str, int] | None:
    """``"Key: value"`` -> ``("Key:", "value", index of the value in text)``; None without a key and a value.

    Example:
        >>> split_key_value("Date:9/3/92"), split_key_value("Time: 14:37"), split_key_value("14:37")
        (('Date:', '9/3/92', 5), ('Time:', '14:37', 6), None)
        >>> split_key_value("Closures--- Standard Blue"), split_key_value("Name:")
        (('Closures', 'Standard Blue', 12), None)
    """
    m = _KEY_VALUE.match(text)
    if m is None:
        return None
    return m.group(1) + (":" if m.group(2) == ":" else ""), m.group(3), m.start(3)


def _split_lines(boxes: list[tuple[float, float, float, float]], texts: list[str], scores: list[float]):
    """Split every "Key: value" / "Key --- value" line into a key piece and a value piece (box split by characters)."""
    out_b, out_t, out_s = [], [], []
    for (y0, x0, y1, x1), text, score in zip(boxes, texts, scores):
        text = text.strip()
        parts = split_key_value(text) if score >= MIN_SCORE else None
        if parts is None:
            out_b += [(y0, x0, y1, x1)]
            out_t += [text]
            out_s += [score]
            continue
        key, value, start = parts
        cut = x0 + (x1 - x0) * (start / len(text))  # the value's box starts where its first character does
        out_b += [(y0, x0, y1, cut), (y0, cut, y1, x1)]
        out_t += [key, value]
        out_s += [score, score]
    return out_b, out_t, out_s


def _pad_for_detection(image: Tensor, det_limit_side_len: int) -> Tensor:
    """Pad a thin image's short side with white paper (bottom or right, so boxes keep their coordinates).

    The detector scales the long side to ``det_limit_side_len`` and rounds both sides to multiples of 32
    px; a short side that scales below 16 px rounds to zero and RapidOCR fails (a 28 x 5600 px banner).
    """
    h, w = image.shape[-2:]
    need = math.ceil(MIN_DETECTED_SIDE * max(h, w) / min(max(h, w), det_limit_side_len))
    if min(h, w) >= need:
        return image
    pad = (0, need - w, 0, 0) if w < h else (0, 0, 0, need - h)  # (left, right, top, bottom)
    return F.pad(image, pad, value=1.0)


def ocr_backend(option: str, device: torch.device) -> dict[str, Any]:
    """RapidOCR's engine options for the text channels' ``ocr`` setting on an image held on ``device``.

    ``auto`` (the default): ONNX Runtime for an image on the CPU (as always), the torch OCR on the image's own
    device otherwise (:class:`~arr_coc.ocr.torch_ocr.TorchOCR`: the same networks, the same texts and boxes), so a
    GPU-held ARR reads its pages where they are. ``onnxruntime`` or ``torch`` choose one.

    >>> ocr_backend("auto", torch.device("cpu")), ocr_backend("torch", torch.device("cpu"))
    ({'backend': 'onnxruntime'}, {'backend': 'torch', 'device': 'cpu'})
    """
    if option not in OCR_BACKENDS:
        raise ValueError(f"the text channels' ocr option must be one of {', '.join(OCR_BACKENDS)}, got {option!r}")
    torch_ocr = option == "torch" or (option == "auto" and device.type != "cpu")
    return {"backend": "torch", "device": str(device)} if torch_ocr else {"backend": "onnxruntime"}


def detect_lines(image: Tensor, query_encoder: Any, det_limit_side_len: int = DET_LIMIT_SIDE_LEN,
                 ocr: str = "auto") -> TextLines:
    """Detect, read and embed the text lines of one image ``[3, H, W]`` float in [0, 1].

    Args:
        image: ``[3, H, W]`` RGB in [0, 1].
        query_encoder: ``.encode(list[str]) -> [N, D]`` L2-normalised (the questions' encoder) and ``.dim``.
        det_limit_side_len: the page is detected at most this many px on its long side.
        ocr: which OCR runs the networks (:func:`ocr_backend`): ``auto``, ``onnxruntime`` or ``torch``.

    Returns:
        :class:`TextLines` with boxes in the pixels of ``image``.
    """
    if not isinstance(image, Tensor) or image.ndim != 3 or image.shape[0] != 3:
        shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(f"detect_lines needs one [3, H, W] RGB image, got {shape}")
    require_rapidocr("the text channels (text_match, key_value)")  # checked on every call: the engine is cached
    # low-confidence lines still say where text is
    engine = rapidocr_engine(det_limit_side_len, text_score=0.0, **ocr_backend(ocr, image.device))
    height, width = image.shape[-2:]
    u8 = to_hwc_uint8(_pad_for_detection(image.detach().float(), det_limit_side_len))
    out = engine(np.ascontiguousarray(u8[..., ::-1]))  # RapidOCR reads a numpy array as BGR
    boxes: list[tuple[float, float, float, float]] = []
    if out.boxes is not None and len(out.boxes):
        quads = np.asarray(out.boxes, dtype=np.float64)  # [L, 4, 2] (x, y) corners
        lo, hi = quads.min(1), quads.max(1)  # [L, 2]
        boxes = [(max(0.0, a[1]), max(0.0, a[0]), min(float(height), b[1]), min(float(width), b[0]))
                 for a, b in zip(lo, hi)]
    texts = [str(t) for t in (out.txts or ())][: len(boxes)]
    scores = [float(s) for s in (out.scores or ())][: len(boxes)]
    boxes, texts, scores = _split_lines(boxes, texts, scores)
    legible = torch.tensor([s >= MIN_SCORE and bool(t) for t, s in zip(texts, scores)], dtype=torch.bool)
    emb = torch.zeros(len(texts), int(query_encoder.dim))  # [L, D]
    if bool(legible.any()):
        emb[legible] = query_encoder.encode([t for t, ok in zip(texts, legible.tolist()) if ok]).float().cpu()
    return TextLines(boxes_px=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), texts=tuple(texts),
                     scores=torch.tensor(scores, dtype=torch.float32), legible=legible, emb=emb)


def sharpen(sim: Tensor, legible: Tensor) -> Tensor:
    """Key weights in [0, 1]: ``relu(s - m) / (max s - m)``, m = median over the legible lines and one 0.

    Most lines of a page are unrelated to a question yet have a MiniLM cosine of ~0.1-0.3; measuring from
    the median line keeps them from flooding the page with weak values, and the extra 0 lets a page with a
    single legible line still weigh it 1 when its similarity is positive.

    Example:
        >>> w = sharpen(torch.tensor([0.1, 0.2, 0.3, 0.7, 0.9]), torch.tensor([True, True, True, True, False]))
        >>> [round(v, 2) for v in w.tolist()]  # median of (0, .1, .2, .3, .7) is .2; the illegible line gets 0
        [0.0, 0.0, 0.2, 1.0, 0.0]
    """
    s = torch.where(legible, sim, torch.zeros_like(sim))
    m = torch.cat([s.new_zeros(1), s[legible]]).median().clamp_min(0)
    top = s.max() if s.numel() else s.new_zeros(())
    if s.numel() == 0 or float(top - m) <= FLAT_RANGE:
        return torch.zeros_like(s)
    return ((s - m).clamp_min(0) / (top - m)) * legible


def value_regions(boxes_px: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Where each key line's value sits, as boxes with values: ``([4L, 4] boxes px, [4L] values)``.

    For key l (box y0, x0, y1, x1, height h, weight w) the nearest other line on its row starting right
    of it within ``RIGHT_REACH`` h, and the nearest line below it overlapping its columns within
    ``BELOW_REACH`` h, are lifted whole; the empty stretch up to them (or up to the reach) is painted weaker::

        +-------+  gap: GAP_WEIGHT*w      +--------------+
        | Date: |.........................|  21/11/2026  |  nearest line on the row: w
        +-------+                         +--------------+
        |.......|  gap below: GAP_WEIGHT*BELOW_WEIGHT*w, at most BELOW_REACH h, the key's columns
        +------------+
        |  9/3/92    |  nearest line below overlapping the key's columns: BELOW_WEIGHT*w
        +------------+

    The key's own box is never among its regions. Missing neighbours give empty boxes (value 0).

    Example:
        >>> boxes = torch.tensor([[0., 0., 10., 30.], [0., 50., 10., 90.]])  # "Name:" and its value
        >>> b, v = value_regions(boxes, torch.tensor([1.0, 0.0]))
        >>> b[v.argmax()].tolist(), v.max().item()
        ([0.0, 50.0, 10.0, 90.0], 1.0)
    """
    n = boxes_px.shape[0]
    if n == 0:
        return boxes_px.new_zeros(0, 4), weights.new_zeros(0)
    y0, x0, y1, x1 = boxes_px.unbind(-1)  # [L] each
    h = (y1 - y0).clamp_min(1.0)
    other = ~torch.eye(n, dtype=torch.bool, device=boxes_px.device)
    v_overlap = torch.minimum(y1[:, None], y1[None]) - torch.maximum(y0[:, None], y0[None])  # [L, L] key, line
    same_row = v_overlap >= ROW_OVERLAP * torch.minimum(h[:, None], h[None])
    gap_right = x0[None] - x1[:, None]  # [L, L] px from the key's end to the line's start
    right = other & same_row & (gap_right >= -0.5 * h[:, None]) & (gap_right <= RIGHT_REACH * h[:, None])
    h_overlap = torch.minimum(x1[:, None], x1[None]) - torch.maximum(x0[:, None], x0[None])
    gap_below = y0[None] - y1[:, None]
    below = other & ~same_row & (h_overlap > 0) & (gap_below >= -0.5 * h[:, None])
    below &= gap_below <= BELOW_REACH * h[:, None]

    def nearest(mask: Tensor, dist: Tensor) -> tuple[Tensor, Tensor]:  # [L] index, [L] bool found
        d = torch.where(mask, dist, torch.full_like(dist, float("inf")))
        return d.argmin(-1), mask.any(-1)

    r_idx, r_ok = nearest(right, gap_right)
    b_idx, b_ok = nearest(below, gap_below)
    right_end = torch.where(r_ok, x0[r_idx], x1 + RIGHT_REACH * h)
    below_end = torch.where(b_ok, y0[b_idx], y1 + BELOW_REACH * h)
    regions = torch.cat([
        torch.stack([y0, x1, y1, torch.maximum(right_end, x1)], -1),  # gap right [L, 4]
        torch.stack([y1, x0, torch.maximum(below_end, y1), x1], -1),  # gap below
        boxes_px[r_idx],  # nearest line right
        boxes_px[b_idx],  # nearest line below
    ])  # [4L, 4] (y0, x0, y1, x1) px
    values = torch.cat([GAP_WEIGHT * weights, GAP_WEIGHT * BELOW_WEIGHT * weights,
                        weights * r_ok, BELOW_WEIGHT * weights * b_ok])  # [4L]
    return regions, values


def lines_entry(query_encoder: Any, det_limit_side_len: int = DET_LIMIT_SIDE_LEN) -> str:
    """The cache entry name of an image's :class:`TextLines`: the embeddings depend on the encoder, and on its
    ``device`` and ``batch_size`` where it has them (a text's vector moves in its last bits with the batch it runs
    in and the device), so encoders that differ in either never read each other's lines.

    >>> from arr_coc.engine.query import MiniLMQueryEncoder
    >>> lines_entry(MiniLMQueryEncoder()), lines_entry(MiniLMQueryEncoder(batch_size=16))
    ('text_lines:960:MiniLMQueryEncoder:384:cpu:256', 'text_lines:960:MiniLMQueryEncoder:384:cpu:16')
    """
    tags = [str(getattr(query_encoder, a)) for a in ("device", "batch_size") if hasattr(query_encoder, a)]
    return ":".join(["text_lines", str(det_limit_side_len), type(query_encoder).__name__, str(query_encoder.dim), *tags])


def lines_from_text(boxes_px: Tensor, texts: list[str], query_encoder: Any) -> TextLines:
    """:class:`TextLines` from lines whose text is known (a PDF's text layer, rendered text): no OCR.

    Every line counts as legible (confidence 1); "Key: value" lines are split as OCR lines are.
    """
    boxes = [tuple(float(v) for v in b) for b in boxes_px.reshape(-1, 4).tolist()]
    boxes, texts, scores = _split_lines(boxes, [str(t) for t in texts], [1.0] * len(texts))
    legible = torch.tensor([bool(t) for t in texts], dtype=torch.bool)
    emb = torch.zeros(len(texts), int(query_encoder.dim))
    if bool(legible.any()):
        emb[legible] = query_encoder.encode([t for t, ok in zip(texts, legible.tolist()) if ok]).float().cpu()
    return TextLines(boxes_px=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), texts=tuple(texts),
                     scores=torch.ones(len(texts)), legible=legible, emb=emb)


def image_lines(cache: Any, image: Tensor, query_encoder: Any, det_limit_side_len: int = DET_LIMIT_SIDE_LEN,
                known: Any = None, ocr: str = "auto") -> TextLines:
    """One image's cached :class:`TextLines`: ``known()`` (lines from a text layer) if given, else OCR.

    Whichever fills the cache first is what ``text_match`` and ``key_value`` read for this image; those channels
    pass the image's known text (``TextureInputs.text``: a page's text layer), so they run no OCR on it.
    """
    compute = known if known is not None else (lambda: detect_lines(image, query_encoder, det_limit_side_len, ocr))
    return cache.get(lines_entry(query_encoder, det_limit_side_len), image, compute)


def _lines(inputs: TextureInputs, channel: str) -> tuple[list[TextLines], Tensor]:
    """Per image its cached :class:`TextLines`, and the question embeddings ``[B, D]``."""
    query_emb = inputs.query_emb  # raises the TextureInputs error before any OCR runs without an encoder
    return _page_lines(inputs, channel), query_emb


def _page_lines(inputs: TextureInputs, channel: str) -> list[TextLines]:
    """Per image its :class:`TextLines`, from the cache or computed into it (OCR per image whose text is not
    known): the text channels' per-image part, which no question changes."""
    if inputs.query_encoder is None:
        raise ValueError(f"the {channel} channel embeds each image's lines with the questions' encoder: "
                         f"pass query_encoder=")
    side = int(inputs.option(channel, "det_limit_side_len", DET_LIMIT_SIDE_LEN))
    ocr = str(inputs.option(channel, "ocr", "auto"))
    return [image_lines(inputs.cache, image, inputs.query_encoder, side, known=_known(inputs.known_text(i), inputs),
                        ocr=ocr) for i, image in enumerate(inputs.pixels)]


TEXT_CHANNELS = ("text_match", "key_value")


def median_height(lines: TextLines, min_lines: int = LEGIBLE_MIN_LINES) -> float | None:
    """The median height (px) of an image's legible lines; None where it has fewer than ``min_lines`` (not a page of
    text: a sign in a photo).

    >>> from arr_coc.engine.query import HashingQueryEncoder
    >>> lines = lines_from_text(torch.tensor([[0.0, 0, 20, 90], [30, 0, 70, 90], [80, 0, 90, 40]]), ["a", "b", "c"],
    ...                         HashingQueryEncoder())
    >>> median_height(lines, min_lines=1), median_height(lines)
    (20.0, None)
    """
    heights = (lines.boxes_px[:, 2] - lines.boxes_px[:, 0])[lines.legible]
    return float(heights.median()) if len(heights) >= max(1, min_lines) else None


def text_lines(arr: Any, scene: Any) -> list[TextLines | None]:
    """Per image of an ARR's ``scene`` its text lines as the ARR's text channels read them (the scene's known text,
    else their OCR: cached once they scored the image, run and cached here otherwise; ``.legible`` marks the lines
    they read); all None where the ARR has no text channel. What the split (:func:`text_heights`) and a lone image's
    line retrieval (:func:`arr_coc.contexts.allocate.image_placing`) read."""
    canvas = scene.canvas
    channel = next((c for c in TEXT_CHANNELS if c in arr.channels), None)
    if channel is None:
        return [None] * canvas.batch_size
    out = []
    for i, (h, w) in enumerate(canvas.sizes):  # each image as the channels read it: its own size group's crop
        inputs = TextureInputs(canvas.pixels[i: i + 1, :, :h, :w], query_encoder=arr.query_encoder, cache=arr.cache,
                               options=arr.config.texture.options, text=None if scene.text is None else [scene.text[i]])
        out.append(_page_lines(inputs, channel)[0])
    return out


def text_heights(arr: Any, scene: Any) -> list[float | None]:
    """Per image of an ARR's ``scene`` the median height (canvas px) of its legible text lines as the ARR's text
    channels read them (:func:`text_lines`); None for an image with fewer than ``LEGIBLE_MIN_LINES`` of them, all None
    where the ARR has no text channel. What :meth:`arr_coc.budget.Budget.split` reads to give one image a gestalt its
    text stays legible in.

    >>> from arr_coc import ARR
    >>> from arr_coc.engine.channel_registry import PageText
    >>> from arr_coc.engine.query import HashingQueryEncoder
    >>> arr = ARR(query_encoder=HashingQueryEncoder())
    >>> lines = [(f"Item {i} 9.99", (10.0 + 12 * i, 5.0, 20.0 + 12 * i, 90.0)) for i in range(8)]  # 8 lines, 10 px
    >>> text_heights(arr, arr.see(torch.ones(3, 112, 112), text=[PageText(lines=lines)]))
    [10.0]
    >>> text_heights(arr, arr.see(torch.zeros(3, 112, 112), text=[PageText(lines=lines[:7])]))  # not a page of text
    [None]
    """
    return [None if lines is None else median_height(lines) for lines in text_lines(arr, scene)]


def _prepare(channel: str) -> Callable[[TextureInputs], None]:
    """``prepare`` of a text channel: its images' lines read and embedded into the cache, no question needed."""

    def prepare(inputs: TextureInputs) -> None:
        _page_lines(inputs, channel)

    return prepare


def _known(text: Any, inputs: TextureInputs) -> Any:
    """``known()`` for :func:`image_lines` from an image's known text (None: it is read by OCR)."""
    if text is None:
        return None
    return lambda: lines_from_text(torch.tensor([b for _, b in text.lines], dtype=torch.float32).reshape(-1, 4),
                                   [t for t, _ in text.lines], inputs.query_encoder)


def _similarity(lines: TextLines, q: Tensor) -> Tensor:
    return lines.emb.to(q) @ q  # [L] cosine; 0 for illegible lines (zero rows)


def reranks(inputs: TextureInputs, channel: str, i: int) -> bool:
    """Whether image ``i``'s lines are scored by the cross-encoder: option ``rerank`` of the channel where it is
    set; by default never (the cosine: a model-free hashing ARR stays model-free, and a context's pages come with
    their text, which the context's own retriever ranks)."""
    return bool(inputs.option(channel, "rerank", False))


def line_scores(inputs: TextureInputs, channel: str, i: int, lines: TextLines, q: Tensor) -> Tensor:
    """[L] how well each line of image ``i`` answers its question: the cross-encoder's logit scaled to [0, 1] over
    the image's legible lines (its best line 1, its worst 0) where :func:`reranks`, else the query encoder's
    cosine; 0 for illegible lines.

    MiniLM compares a question and a line as two sentences, so "How much was paid in the end?" matches lines
    that share its topic words; the cross-encoder (ms-marco, trained on question -> passage relevance) reads
    them together and ranks the line the question asks for first more often (see docs/coc.md, "One image").
    """
    if not reranks(inputs, channel, i):
        return _similarity(lines, q)
    scores = torch.zeros(len(lines))
    idx = lines.legible.nonzero().flatten().tolist()
    if idx:
        logit = cross_encoder().rerank(inputs.queries[i], [lines.texts[j] for j in idx])  # one pair cache
        span = float(logit.max() - logit.min())
        scores[idx] = (logit - logit.min()) / span if span > FLAT_RANGE else torch.ones_like(logit)
    return scores.to(q)


def _per_image(inputs: TextureInputs, channel: str, paint) -> Tensor:
    """``paint(lines, line_scores, size) -> [H, W]`` for each image: a loop over images, each with its own lines."""
    lines, query_emb = _lines(inputs, channel)
    size = tuple(inputs.pixels.shape[-2:])
    maps = [paint(tl, line_scores(inputs, channel, i, tl, q), size) for i, (tl, q) in enumerate(zip(lines, query_emb))]
    return torch.stack(maps)[:, None].to(inputs.pixels)  # [B, 1, H, W]


@register_channel("text_match", differentiable=False, needs_query=True, prepare=_prepare("text_match"))
def _text_match(inputs: TextureInputs) -> Tensor:
    """Text lines whose reading answers the question (cross-encoder or cosine), the best line of the image at 1."""

    def paint(tl: TextLines, scores: Tensor, size: tuple[int, int]) -> Tensor:
        s = scores.clamp_min(0)  # [L]
        top = float(s.max()) if len(tl) else 0.0
        values = s / top if top > FLAT_RANGE else torch.zeros_like(s)
        return paint_boxes(tl.boxes_px.to(s.device), values, size)  # [H, W]

    return _per_image(inputs, "text_match", paint)


@register_channel("key_value", differentiable=False, needs_query=True, prepare=_prepare("key_value"))
def _key_value(inputs: TextureInputs) -> Tensor:
    """Where the value of the line that matches the question sits: right of it on its row, or below it."""

    def paint(tl: TextLines, scores: Tensor, size: tuple[int, int]) -> Tensor:
        weights = sharpen(scores, tl.legible.to(scores.device))  # [L]
        regions, values = value_regions(tl.boxes_px.to(scores.device), weights)  # [4L, 4], [4L]
        return paint_boxes(regions, values, size).clamp(0, 1)  # [H, W]

    return _per_image(inputs, "key_value", paint)
