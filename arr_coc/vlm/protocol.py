"""The VLM adapter protocol: what arr-coc needs from a frozen VLM family, with its capabilities declared.

Every family subclasses :class:`VLMAdapter` and registers in :data:`ADAPTERS` under its config's
``model_type``. What a family can do beyond the common core is declared, never probed:

* ``capabilities``: a frozenset of :data:`CAPABILITIES` -- ``first_look`` (it encodes the gestalt
  alone, :meth:`VLMAdapter.encode_gestalt`, and reuses those tokens in ``encode(..., encoded=)``,
  which the first look at the gestalt needs) and ``processor`` (it encodes through the model's own
  image processor at a token cap, :meth:`VLMAdapter.encode_processed`);
* ``layouts``: the saccade layouts of ``encode`` it distinguishes (an M-RoPE model places saccades
  in the gestalt's frame or as a second temporal slice; a 1-D RoPE has one layout).

:meth:`VLMAdapter.require` and :meth:`VLMAdapter.check_layout` refuse the rest in one line.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

import torch
from torch import Tensor

from arr_coc.registry import Registry
from arr_coc.vlm.processing import LAYOUTS, VisualTokens

FIRST_LOOK, PROCESSOR = "first_look", "processor"
CAPABILITIES = {
    FIRST_LOOK: "encodes the gestalt alone and reuses it (the Qwen-VL families)",
    PROCESSOR: "encodes through the model's own image processor at a token cap (the Qwen-VL families)",
}


class VLMAdapter(ABC):
    """A frozen VLM family behind one interface: visual tokens in, LLM hidden states and logits out."""

    name: ClassVar[str]  # the registry name (the config's model_type)
    rope_rows: ClassVar[int]  # 3 for M-RoPE, 1 for 1-D RoPE
    merge: ClassVar[int] | int  # tower patches per token side (Qwen: 2, LLaVA: 1)
    capabilities: ClassVar[frozenset[str]] = frozenset()  # of CAPABILITIES
    layouts: ClassVar[tuple[str, ...]] = LAYOUTS  # saccade layouts encode distinguishes

    cell: int  # px per LLM token side (one merged token); the canvas is built on this cell
    model: Any  # the transformers ``*ForConditionalGeneration``
    visual: torch.nn.Module  # the vision tower
    lm: Any  # the decoder (``layers``, ``embed_tokens``, ``rotary_emb``): the first look reads its attention
    head: torch.nn.Module  # the LM head
    text_config: Any  # the LLM's config (decode cache, eos)
    tokenizer: Any
    image_token_id: int  # the image placeholder id: what the prompt ids hold at visual tokens

    # ------------------------------------------------------------------ declared capabilities
    def require(self, capability: str, why: str) -> None:
        """Raise a one-line ValueError unless this family declares ``capability``; ``why`` names the asker."""
        if capability not in CAPABILITIES:
            raise KeyError(f"unknown VLM capability {capability!r}")  # a bug in the caller, not bad input
        if capability not in self.capabilities:
            having = [n for n in ADAPTERS.names() if capability in ADAPTERS.get(n).capabilities]
            raise ValueError(f"{why} needs an adapter that {CAPABILITIES[capability]}; {self.name} does not: "
                             f"use {', '.join(having) or 'another family'}")

    def check_layout(self, layout: str) -> None:
        """Raise a one-line ValueError unless ``layout`` is one this family distinguishes."""
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
        if layout not in self.layouts:
            raise ValueError(f"{self.name} has one saccade layout ({', '.join(self.layouts)}): its 1-D RoPE sends "
                             f"tokens in sequence; layout {layout!r} needs an M-RoPE family (the Qwen-VL ones)")

    @property
    def device(self) -> torch.device:
        """Where the language model sits: the first look and the answer run there."""
        return next(self.lm.parameters()).device

    # ------------------------------------------------------------------ visual tokens
    @abstractmethod
    def encode(self, images: Sequence[Tensor], cells: Sequence[Tensor | None], *, mode: str = "sparse",
               gestalt: Sequence[Any] | None = None, layout: str = "scaled",
               weights: Sequence[Tensor | None] | None = None,
               encoded: Sequence[VisualTokens | None] | None = None) -> list[VisualTokens]:
        """Visual tokens per image ([3, H, W] in [0, 1], sides multiples of ``cell``) for its cells [K, 2].

        ``encoded``: per image its gestalt already encoded (:meth:`encode_gestalt`), reused
        (capability ``first_look``).
        """

    @abstractmethod
    def encode_patches(self, images: Sequence[Tensor], boxes: Sequence[Tensor], *,
                       gestalt: Sequence[Any] | None = None, layout: str = "scaled",
                       encoded: Sequence[VisualTokens | None] | None = None) -> list[VisualTokens]:
        """Variable-size squares [K, 3] (y, x, side), each shrunk to one token at its centre."""

    @abstractmethod
    def encode_native(self, images: Sequence[Tensor]) -> list[VisualTokens]:
        """The model's own encoding of each image (the exactness reference)."""

    def encode_gestalt(self, images: Sequence[Tensor], grids: Sequence[tuple[int, int]]) -> list[VisualTokens]:
        """Only the gestalt of each image, at its place (capability ``first_look``)."""
        self.require(FIRST_LOOK, "encode_gestalt")
        raise NotImplementedError  # a family declaring first_look overrides this

    def encode_processed(self, images: Sequence[Any], max_tokens: int) -> list[VisualTokens]:
        """The model's own processor view of PIL images at a token cap (capability ``processor``)."""
        self.require(PROCESSOR, "encode_processed")
        raise NotImplementedError  # a family declaring processor overrides this

    # ------------------------------------------------------------------ language model
    @abstractmethod
    def prompt_ids(self, question: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the image for one question (chat template applied)."""

    @abstractmethod
    def language_model(self, x: dict[str, Any]) -> Tensor:
        """Final hidden states [B, L, D] for ``x``: inputs_embeds, attention_mask, position_ids [R, B, L],
        optional past_key_values, visual_mask and deepstack (prefill only)."""

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """Token embeddings [B, L] -> [B, L, D]."""
        return self.lm.embed_tokens(ids)

    def logits(self, hidden: Tensor) -> Tensor:
        """LM head: [B, L, D] -> [B, L, V]."""
        return self.head(hidden)

    @abstractmethod
    def native_inputs(self, images: Sequence[Tensor], questions: Sequence[str]) -> dict[str, Tensor]:
        """Inputs for the model's own forward on the same images: the exactness reference."""


ADAPTERS: Registry[type[VLMAdapter]] = Registry("VLM adapter")
