"""Frozen VLMs driven through Hugging Face transformers: one adapter per family behind one protocol."""
from arr_coc.vlm.base import ADAPTERS, LAYOUTS, MODES, Prefill, VisualTokens, VLMAdapter, assemble, generate
from arr_coc.vlm import llava, qwen  # noqa: F401  (registers the adapters)
from arr_coc.vlm.ask import Answer, ask, load_vlm

__all__ = ["ADAPTERS", "Answer", "ask", "load_vlm", "LAYOUTS", "MODES", "Prefill", "VisualTokens", "VLMAdapter", "assemble", "generate"]
