"""The one RapidOCR engine factory (PP-OCR detection + recognition, ONNX models shipped in the wheel, offline).

The text channels (``arr_coc.engine.channels.text``) and the ``rapidocr`` reader of the evaluation
(``arr_coc.eval.reading``) both build their engine here, so one set of options means the same engine and
building it (two ONNX sessions) is paid once per process and options.

The engine recognises the detected lines two at a time (:class:`PairedLinesOCR`) in RapidOCR's own groups
and widths, so it reads exactly what RapidOCR reads while holding two lines' activations, not six.
With ``backend="torch"`` the same networks run as torch modules on a chosen device (``torch_ocr.TorchOCR``,
converted from the shipped ONNX files by ``onnx_graph.OnnxGraph``), RapidOCR's steps around them unchanged.
"""
from __future__ import annotations

import copy
from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

from arr_coc.errors import MissingDependencyError

INSTALL_RAPIDOCR = "pip install rapidocr onnxruntime"
# Detection runs at most 960 px on the long side (``Det.limit_type="max"``). RapidOCR's default ("min", 736)
# upscales the SHORT side to 736 px, which costs seconds on small crops (a 300x60 px crop becomes
# 3680x736 px) and does nothing on a page whose short side is already larger; capping the long side at 960
# found every line of a FUNSD form (762x1000 px) that full resolution found, while 736 lost 1 of 26 lines
# and misread others (measured).
DET_LIMIT_SIDE_LEN = 960
# RapidOCR's own default cut-off (``Global.text_score``) for a recognised text: below it a reading is mostly
# wrong characters.
TEXT_SCORE = 0.5
# Lines recognised at once. ONNX Runtime computes every row of a batch of 2 or more exactly as in RapidOCR's
# batch of 6 (bit for bit), but a batch of one line takes another kernel path whose results differ in the last
# bits (up to 1.6e-6 on the CTC probabilities), enough to flip a score's fifth decimal: measured by
# ``benchmarks/ocr_lines.py``.
LINES_AT_ONCE = 2
# Where the PP-OCR networks run: ONNX Runtime on the CPU (the default), or torch modules on a torch device.
BACKENDS = ("onnxruntime", "torch")


def require_rapidocr(what: str, alternative: str = "") -> ModuleType:
    """The ``rapidocr`` module, or a MissingDependencyError (an ImportError) saying ``what`` needs it and how to install it.

    Example:
        >>> require_rapidocr("the text channels").__name__
        'rapidocr'
    """
    try:
        import rapidocr
    except ImportError as err:
        raise MissingDependencyError(f"{what} needs RapidOCR: {INSTALL_RAPIDOCR}{alternative}") from err
    return rapidocr


def rapidocr_engine(det_limit_side_len: int = DET_LIMIT_SIDE_LEN, text_score: float = TEXT_SCORE,
                    backend: str = "onnxruntime", device: Any = None) -> Any:
    """The RapidOCR engine for these options, built once per process; call it on an ``[H, W, 3]`` uint8 array.

    Args:
        det_limit_side_len: the image is detected at most this many px on its long side.
        text_score: recognised texts scoring below it are dropped (0 keeps every detected line, whose box
            still says where text is).
        backend: ``"onnxruntime"`` (:class:`PairedLinesOCR`, on the CPU) or ``"torch"``
            (:class:`arr_coc.ocr.torch_ocr.TorchOCR`: the same networks converted to torch modules, run on ``device``;
            it also reads several images at once with ``.read(images)``).
        device: the torch device for ``backend="torch"`` (default ``"cpu"``); ONNX Runtime takes none.

    Example:
        >>> rapidocr_engine(640) is rapidocr_engine(640.0, text_score=0.5)
        True
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown OCR backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "onnxruntime":
        if device is not None:
            raise ValueError(f"the onnxruntime OCR backend runs on the CPU and takes no device (got {device!r}); "
                             "use backend='torch' to run the OCR on a torch device")
        return _engine(int(det_limit_side_len), float(text_score))  # one cache key per options, however spelled
    return _torch_engine(int(det_limit_side_len), float(text_score), torch_device(device))


def torch_device(device: Any) -> str:
    """``device`` (None: the CPU) as the torch OCR's cache key, or a ValueError naming what is wrong with it."""
    import torch

    try:
        where = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"the OCR's device {device!r} is no torch device: {err}") from None
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"the OCR's device {device!r} needs CUDA, which this torch does not see; use device='cpu' "
                         "or the default onnxruntime backend")
    return str(where)


def rapidocr_params(det_limit_side_len: int, text_score: float) -> dict[str, Any]:
    """RapidOCR's options for the engine (``RapidOCR(params=...)``)."""
    return {
        "Global.log_level": "error",  # an image without text is a valid result (no lines), not a warning
        "Global.use_cls": False,  # canvases and their crops are upright; the orientation classifier only costs time
        "Global.text_score": text_score,
        "Det.limit_type": "max",
        "Det.limit_side_len": det_limit_side_len,
    }


@lru_cache(maxsize=8)
def _engine(det_limit_side_len: int, text_score: float) -> PairedLinesOCR:
    return PairedLinesOCR(require_rapidocr("OCR").RapidOCR(params=rapidocr_params(det_limit_side_len, text_score)))


@lru_cache(maxsize=8)
def _torch_engine(det_limit_side_len: int, text_score: float, device: str) -> Any:
    from arr_coc.ocr.torch_ocr import TorchOCR  # torch modules from the ONNX files: built only when asked for

    return TorchOCR(require_rapidocr("OCR").RapidOCR(params=rapidocr_params(det_limit_side_len, text_score)), device)


class PairedLinesOCR:
    """RapidOCR's detection and recognition, recognising two lines at a time; call it as RapidOCR.

    RapidOCR sorts the detected lines by aspect ratio and recognises them ``Rec.rec_batch_num`` (6) at a time,
    each resized to 48 px high and padded to the widest of its group; on a dense page the recogniser's
    activations for six such lines are most of the call's peak (reading a 1275 x 1650 px page of 49 lines
    raised it by 471 MB; by 182 MB two lines at a time: ``benchmarks/ocr_lines.py``). Here the same groups are formed and
    every line is padded to its group's width as there, but sent to the ONNX session in batches of
    :data:`LINES_AT_ONCE`: each row comes out bit for bit as in RapidOCR's batch, so every box, text and
    score is the one RapidOCR gives (equal on 75 of 75 FUNSD, SROIE and example images). A group of one line
    is read alone, as RapidOCR reads it; the odd line of a larger group beside a copy of itself. Reading each
    line alone at its own width instead changes what the recogniser reads (``--own-width`` counts the lines).

    Built from RapidOCR's public steps (``load_img``, ``preprocess_img``, ``detect_and_crop``,
    ``build_final_output``) and its ``TextRecognizer``'s pieces (``resize_norm_img``, ``session``,
    ``postprocess_op``); the orientation classifier stays off, as in :func:`rapidocr_params`.
    """

    def __init__(self, ocr: Any) -> None:
        from rapidocr.ch_ppocr_rec import TextRecognizer

        if ocr.cfg.Global.use_cls or not (ocr.cfg.Global.use_det and ocr.cfg.Global.use_rec):
            raise ValueError("PairedLinesOCR runs detection and recognition without the orientation classifier")
        self.ocr = ocr
        cfg = copy.deepcopy(ocr.cfg.Rec)  # filled as RapidOCR fills it before building its own recogniser
        cfg.engine_cfg = ocr.cfg.EngineConfig[cfg.engine_type.value]
        cfg.font_path = ocr.cfg.Global.font_path
        cfg.model_root_dir = ocr.cfg.Global.model_root_dir
        self.rec = TextRecognizer(cfg)

    def __call__(self, image: Any) -> Any:
        """RapidOCR's result (``RapidOCROutput``: boxes, txts, scores) for an image RapidOCR accepts."""
        from rapidocr.ch_ppocr_cls import TextClsOutput
        from rapidocr.ch_ppocr_det import TextDetOutput
        from rapidocr.ch_ppocr_rec import TextRecOutput
        from rapidocr.main import RapidOCRError

        ocr = self.ocr
        original = ocr.load_img(image)
        img, op_record = ocr.preprocess_img(original)
        try:
            crops, det = ocr.detect_and_crop(img, op_record)
        except RapidOCRError:  # no text detected: RapidOCR's own empty result
            return ocr.build_final_output(original, TextDetOutput(), TextClsOutput(), TextRecOutput(), [], op_record)
        return ocr.build_final_output(original, det, TextClsOutput(), self.recognize(crops), crops, op_record)

    def recognize(self, crops: list[np.ndarray]) -> Any:
        """``TextRecognizer(crops)``'s result: RapidOCR's groups and widths, :data:`LINES_AT_ONCE` lines a call."""
        from rapidocr.ch_ppocr_rec import TextRecOutput

        rec, word_box = self.rec, self.ocr.return_word_box
        out: list[Any] = [(("", 0.0), None)] * len(crops)
        for group, group_ratio in line_groups(crops, rec.rec_batch_num, rec.rec_image_shape):
            for start in range(0, len(group), LINES_AT_ONCE):
                part = group[start:start + LINES_AT_ONCE]
                rows = [rec.resize_norm_img(crops[i], group_ratio)[np.newaxis] for i in part]
                if len(group) > 1:  # RapidOCR read this line in a batch: never alone (another kernel path)
                    rows += rows[-1:] * (LINES_AT_ONCE - len(rows))
                preds = rec.session(np.concatenate(rows).astype(np.float32))[: len(part)]
                lines, words = rec.postprocess_op(
                    preds, word_box, wh_ratio_list=[crops[i].shape[1] * 1.0 / crops[i].shape[0] for i in part],
                    max_wh_ratio=group_ratio)
                for k, i in enumerate(part):
                    out[i] = (lines[k], words[k] if word_box else None)
        line_results, word_results = zip(*out) if out else ((), ())
        txts, scores = zip(*line_results) if line_results else ((), ())
        return TextRecOutput(crops, tuple(txts), tuple(scores), tuple(word_results))


def line_groups(crops: list[np.ndarray], batch: int, shape: tuple[int, ...]) -> list[tuple[list[int], float]]:
    """RapidOCR's groups of lines (``TextRecognizer.__call__``): (the crops' indices, their padded width / height).

    The lines are sorted by width / height (the same ``np.argsort``, so ties fall the same way) and cut into
    groups of ``batch``; a group's lines are resized to ``shape``'s height and padded to the widest of them,
    and never narrower than ``shape`` (3, 48, 320).

    Example:
        >>> crops = [np.zeros((10, w, 3), np.uint8) for w in (200, 50, 400, 100)]
        >>> line_groups(crops, 3, (3, 48, 320))
        [([1, 3, 0], 20.0), ([2], 40.0)]
    """
    ratios = [c.shape[1] / float(c.shape[0]) for c in crops]
    order = np.argsort(np.array(ratios))
    _, height, width = shape[:3]
    groups = []
    for start in range(0, len(crops), batch):
        group = [int(i) for i in order[start:start + batch]]
        groups.append((group, max([width / height] + [crops[i].shape[1] * 1.0 / crops[i].shape[0] for i in group])))
    return groups
