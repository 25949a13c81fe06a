"""Former home of the VLM processing, protocol, decoding and cost helpers: names re-exported for old imports.

New code imports from :mod:`arr_coc.vlm.processing`, :mod:`arr_coc.vlm.protocol`,
:mod:`arr_coc.vlm.generation` and :mod:`arr_coc.vlm.cost`; this module goes once no caller needs it.
"""
from arr_coc.vlm.cost import flops_estimate, llm_chunk_flops
from arr_coc.vlm.generation import generate, synchronize, timed
from arr_coc.vlm.processing import (CLIP_MEAN, CLIP_STD, LAYOUTS, MODES, Prefill, VisualTokens, all_cells, assemble,
                                    box_centres, chat_ids, check_boxes, check_cells, check_options, image_grid,
                                    left_pad, left_pad_rows, mode_cells, per_image, split_at_image, table_taps)
from arr_coc.vlm.protocol import ADAPTERS, VLMAdapter

__all__ = ["ADAPTERS", "CLIP_MEAN", "CLIP_STD", "LAYOUTS", "MODES", "Prefill", "VLMAdapter", "VisualTokens",
           "all_cells", "assemble", "box_centres", "chat_ids", "check_boxes", "check_cells", "check_options",
           "flops_estimate", "generate", "image_grid", "left_pad", "left_pad_rows", "llm_chunk_flops", "mode_cells",
           "per_image", "split_at_image", "synchronize", "table_taps", "timed"]
