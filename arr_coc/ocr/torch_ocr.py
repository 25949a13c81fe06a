"""RapidOCR with its PP-OCR networks run by torch on a chosen device (``rapidocr_engine(backend="torch")``).

The ONNX files RapidOCR ships in its wheel are converted once per process and device into modules
(:class:`arr_coc.ocr.onnx_graph.OnnxGraph`); everything around the networks is RapidOCR's own code, as
:class:`arr_coc.ocr.PairedLinesOCR` uses it: ``load_img``, ``preprocess_img``, the vertical padding, the
detector's resize / normalise and DB post-processing, ``crop_text_regions``, the recogniser's groups of six
lines sorted by aspect ratio and padded to the widest of each group (the padding changes what the recogniser
reads, so the groups are kept), CTC decoding and ``build_final_output``. Only where the networks run changes:

- detection: the images of :meth:`TorchOCR.read` whose resized inputs have the same size go through the
  detector together, in batches of :data:`DET_IMAGES_AT_ONCE`;
- recognition: every group of every image padded to the same width goes through the recogniser together, in
  batches of :data:`LINES_AT_ONCE_TORCH` lines; the CTC arg-max runs on the device, so only a line's best
  class and its probability per time step come back, not the 18,710 class probabilities.
"""
from __future__ import annotations

import copy
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arr_coc.ocr import line_groups
from arr_coc.ocr.onnx_graph import OnnxGraph, require_onnx

# Images detected in one pass (those of one size only): a 960 px page's activations are ~1 GB at a time.
DET_IMAGES_AT_ONCE = 8
# Lines recognised in one pass (groups of one padded width only).
LINES_AT_ONCE_TORCH = 48


def model_file(cfg: Any) -> Path:
    """The ONNX file RapidOCR's session for ``cfg`` (its ``Det`` or ``Rec`` section, filled) loads; never downloaded."""
    from rapidocr.inference_engine.base import FileInfo
    from rapidocr.inference_engine.onnxruntime import OrtInferSession

    if cfg.get("model_path"):
        return Path(cfg.model_path)
    info = FileInfo(engine_type=cfg.engine_type, ocr_version=cfg.ocr_version, task_type=cfg.task_type,
                    lang_type=cfg.lang_type, model_type=cfg.model_type)
    path = Path(cfg.model_root_dir) / Path(OrtInferSession.get_model_url(info)["model_dir"]).name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not there: the torch OCR converts the model files RapidOCR ships, "
                                "reinstall rapidocr")
    return path


@lru_cache(maxsize=8)
def onnx_network(path: str, device: str) -> OnnxGraph:
    """The ONNX model at ``path`` as an :class:`OnnxGraph` on ``device``, converted once per process and device."""
    return OnnxGraph(require_onnx("the torch OCR").load(path)).eval().to(torch.device(device))


class TorchOCR:
    """RapidOCR's detection and recognition with the networks as torch modules on ``device``; call it as RapidOCR.

    Built from the same RapidOCR object (its options) as :class:`arr_coc.ocr.PairedLinesOCR`; the orientation
    classifier stays off. ``TorchOCR(ocr)(image)`` gives RapidOCR's ``RapidOCROutput`` (boxes, txts, scores);
    :meth:`read` reads several images at once.
    """

    def __init__(self, ocr: Any, device: str | torch.device = "cpu") -> None:
        from rapidocr.ch_ppocr_det import TextDetector
        from rapidocr.ch_ppocr_rec import TextRecognizer

        if ocr.cfg.Global.use_cls or not (ocr.cfg.Global.use_det and ocr.cfg.Global.use_rec):
            raise ValueError("TorchOCR runs detection and recognition without the orientation classifier")
        self.ocr, self.device = ocr, torch.device(device)
        # RapidOCR's detector and recogniser, filled as RapidOCR fills them: their pre- and post-processing
        # (and the recogniser's character list, from the model file) are used; their ONNX sessions are not
        det_cfg, rec_cfg = copy.deepcopy(ocr.cfg.Det), copy.deepcopy(ocr.cfg.Rec)
        for cfg in (det_cfg, rec_cfg):
            cfg.engine_cfg = ocr.cfg.EngineConfig[cfg.engine_type.value]
            cfg.model_root_dir = ocr.cfg.Global.model_root_dir
        rec_cfg.font_path = ocr.cfg.Global.font_path
        self.det, self.rec = TextDetector(det_cfg), TextRecognizer(rec_cfg)
        self.det_net = onnx_network(str(model_file(det_cfg)), str(self.device))
        self.rec_net = onnx_network(str(model_file(rec_cfg)), str(self.device))

    def __call__(self, image: Any) -> Any:
        """RapidOCR's result (``RapidOCROutput``: boxes, txts, scores) for an image RapidOCR accepts."""
        return self.read([image])[0]

    def read(self, images: list[Any]) -> list[Any]:
        """RapidOCR's result for each image, the detector and recogniser batched across the images."""
        from rapidocr.ch_ppocr_cls import TextClsOutput
        from rapidocr.ch_ppocr_det import TextDetOutput
        from rapidocr.ch_ppocr_rec import TextRecOutput
        from rapidocr.utils.process_img import apply_vertical_padding

        ocr = self.ocr
        originals = [ocr.load_img(image) for image in images]
        prepared = []
        for original in originals:  # as RapidOCR.detect_and_crop
            img, record = ocr.preprocess_img(original)
            if ocr.cfg.Global.use_vertical_padding:
                img, record = apply_vertical_padding(img, record, ocr.width_height_ratio, ocr.min_height)
            else:
                record["padding_1"] = {"top": 0, "left": 0}
            prepared.append((img, record))
        dets = self.detect([img for img, _ in prepared])
        crops = [ocr.crop_text_regions(img, det.boxes) if det.boxes is not None else []
                 for (img, _), det in zip(prepared, dets)]
        recs = self.recognize(crops)
        out = []
        for original, (_, record), det, lines, rec in zip(originals, prepared, dets, crops, recs):
            if det.boxes is None:  # no text detected: RapidOCR's own empty result
                det, rec = TextDetOutput(), TextRecOutput()
            out.append(ocr.build_final_output(original, det, TextClsOutput(), rec, lines, record))
        return out

    @torch.inference_mode()
    def detect(self, images: list[np.ndarray]) -> list[Any]:
        """``TextDetector(image)``'s result for each image; images of one resized size in one pass."""
        from rapidocr.ch_ppocr_det import TextDetOutput

        det = self.det
        inputs = [det.get_preprocess()(img) for img in images]
        preds: list[np.ndarray | None] = [None] * len(images)
        by_size: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, x in enumerate(inputs):
            if x is not None:
                by_size[x.shape].append(i)
        for same in by_size.values():
            for start in range(0, len(same), DET_IMAGES_AT_ONCE):
                part = same[start:start + DET_IMAGES_AT_ONCE]
                batch = torch.from_numpy(np.concatenate([inputs[i] for i in part])).to(self.device)
                maps = self.det_net(batch).float().cpu().numpy()
                for k, i in enumerate(part):
                    preds[i] = maps[k:k + 1]
        out = []
        for img, pred in zip(images, preds):  # as TextDetector.__call__
            boxes, scores = det.postprocess_op(pred, img.shape[:2]) if pred is not None else ([], [])
            out.append(TextDetOutput(img, det.sorted_boxes(boxes), scores) if len(boxes) else TextDetOutput())
        return out

    @torch.inference_mode()
    def recognize(self, crops: list[list[np.ndarray]]) -> list[Any]:
        """``TextRecognizer(lines)``'s result for each image's lines: RapidOCR's groups, batched by padded width."""
        from rapidocr.ch_ppocr_rec import TextRecOutput

        rec, word_box = self.rec, self.ocr.return_word_box
        groups = [(image, group, ratio) for image, lines in enumerate(crops)
                  for group, ratio in line_groups(lines, rec.rec_batch_num, rec.rec_image_shape)]
        by_width: dict[int, list[tuple[int, int]]] = defaultdict(list)  # width -> (group, line in group)
        for g, (_, group, ratio) in enumerate(groups):
            by_width[int(rec.rec_image_shape[1] * ratio)] += [(g, k) for k in range(len(group))]
        best: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for rows in by_width.values():
            for start in range(0, len(rows), LINES_AT_ONCE_TORCH):
                part = rows[start:start + LINES_AT_ONCE_TORCH]
                batch = np.concatenate([rec.resize_norm_img(crops[groups[g][0]][groups[g][1][k]], groups[g][2])
                                        [np.newaxis] for g, k in part]).astype(np.float32)
                probs = self.rec_net(torch.from_numpy(batch).to(self.device))
                top, index = probs.max(dim=2)  # CTCLabelDecode's max and arg-max (the first of ties, as numpy's)
                top, index = top.float().cpu().numpy(), index.cpu().numpy()
                for row, key in enumerate(part):
                    best[key] = (index[row], top[row])
        results: list[list[Any]] = [[(("", 0.0), None)] * len(lines) for lines in crops]
        for g, (image, group, ratio) in enumerate(groups):
            lines = crops[image]
            index = np.stack([best[g, k][0] for k in range(len(group))])
            top = np.stack([best[g, k][1] for k in range(len(group))])
            texts, words = rec.postprocess_op.decode(  # as CTCLabelDecode.__call__
                index, top, word_box, [lines[i].shape[1] * 1.0 / lines[i].shape[0] for i in group], ratio,
                remove_duplicate=True)
            for k, i in enumerate(group):
                results[image][i] = (texts[k], words[k] if word_box else None)
        out = []
        for lines, result in zip(crops, results):
            line_results, word_results = zip(*result) if result else ((), ())
            txts, scores = zip(*line_results) if line_results else ((), ())
            out.append(TextRecOutput(lines, tuple(txts), tuple(scores), tuple(word_results)))
        return out
