"""Frozen VLMs driven through Hugging Face transformers: one adapter per family behind one protocol, one staged path."""
from arr_coc.vlm import llava, qwen  # noqa: F401  (registers the adapters)
from arr_coc.vlm.allocation import Planned, allocate
from arr_coc.vlm.answer import ask, load_vlm
from arr_coc.vlm.generation import generate
from arr_coc.vlm.processing import LAYOUTS, MODES, Prefill, VisualTokens, assemble
from arr_coc.vlm.protocol import ADAPTERS, VLMAdapter
from arr_coc.vlm.reply import Answer, PageSent
from arr_coc.vlm.stages import Prompt, decode, encode, prefill

__all__ = ["ADAPTERS", "Answer", "ask", "load_vlm", "LAYOUTS", "MODES", "PageSent", "Planned", "Prefill", "Prompt", "VisualTokens",
           "VLMAdapter", "allocate", "assemble", "decode", "encode", "generate", "prefill"]
