"""The one RapidOCR engine factory (PP-OCR detection + recognition, ONNX models shipped in the wheel, offline).

The text channels (``arr_coc.engine.channels.text``) and the ``rapidocr`` reader of the evaluation
(``arr_coc.eval.reading``) both build their engine here, so one set of options means the same engine and
building it (two ONNX sessions) is paid once per process and options.
"""
from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import Any

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


def rapidocr_engine(det_limit_side_len: int = DET_LIMIT_SIDE_LEN, text_score: float = TEXT_SCORE) -> Any:
    """The RapidOCR engine for these options, built once per process; call it on an ``[H, W, 3]`` uint8 array.

    Args:
        det_limit_side_len: the image is detected at most this many px on its long side.
        text_score: recognised texts scoring below it are dropped (0 keeps every detected line, whose box
            still says where text is).

    Example:
        >>> rapidocr_engine(640) is rapidocr_engine(640.0, text_score=0.5)
        True
    """
    return _engine(int(det_limit_side_len), float(text_score))  # one cache key per options, however spelled


@lru_cache(maxsize=8)
def _engine(det_limit_side_len: int, text_score: float) -> Any:
    params = {
        "Global.log_level": "error",  # an image without text is a valid result (no lines), not a warning
        "Global.use_cls": False,  # canvases and their crops are upright; the orientation classifier only costs time
        "Global.text_score": text_score,
        "Det.limit_type": "max",
        "Det.limit_side_len": det_limit_side_len,
    }
    return require_rapidocr("OCR").RapidOCR(params=params)
