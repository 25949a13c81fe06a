"""Configuration dataclasses, one per component; each default carries its reason."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from arr_coc.budget import gestalt_grid
from arr_coc.texture import DEFAULT_CHANNELS

# The reference budget: a 16x16 gestalt (256) + 273 saccades = 529 tokens, about a quarter of a
# 1344x1344 page at full resolution (2304 tokens at 28 px).
DEFAULT_BUDGET = 273


@dataclass
class CanvasConfig:
    # one LLM token = 2x2 merged 14 px patches (Qwen2/2.5-VL); 32 for Qwen3-VL
    cell: int = field(default=28, metadata={"help": "token cell in px: 28 for Qwen2/2.5-VL, 32 for Qwen3-VL"})
    min_pixels: int = field(default=56 * 56, metadata={"help": "smallest canvas area in px"})  # Qwen's: 2x2 tokens
    # 4096 full-resolution tokens: A4 pages stay legible, texture stays < 0.5 GB
    max_pixels: int = field(default=1792 * 1792, metadata={"help": "largest canvas area in px"})

    @property
    def max_tokens(self) -> int:
        return self.max_pixels // (self.cell * self.cell)


# The 13-channel MVP texture plus the channels that helped at equal tokens in the ablation (README):
# the text channels on forms and receipts (one OCR pass per image, ~2 s on two CPU cores; silent on
# photos without text) and learned saliency on all three datasets (~0.6 s per image).
PIPELINE_CHANNELS = DEFAULT_CHANNELS + ("text_match", "key_value", "learned_saliency")


@dataclass
class TextureConfig:
    # None = PIPELINE_CHANNELS; arr_coc.texture.DEFAULT_CHANNELS is the query-blind 13-channel MVP
    channels: tuple[str, ...] | None = None
    # per-channel settings, e.g. {"clip": {"model": "/path/to/clip"}}
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class GestaltConfig:
    grid: tuple[int, int] | None = None  # (rows, cols) of gestalt tokens; None: arr_coc.budget's rule

    def grid_for(self, budget: int, cells_hw: tuple[int, int]) -> tuple[int, int]:
        """Gestalt grid sent with ``budget`` saccades on an image of ``cells_hw`` token cells.

        >>> GestaltConfig().grid_for(273, (48, 48)), GestaltConfig(grid=(4, 6)).grid_for(64, (48, 48))
        ((16, 16), (4, 6))
        """
        if self.grid is None:
            return gestalt_grid(budget, cells_hw)
        return min(self.grid[0], cells_hw[0]), min(self.grid[1], cells_hw[1])


@dataclass
class ScorerConfig:
    # the three-way scorer (relevance.py); "mvp" is the 86-weight baseline scorer
    name: str = field(default="contextual", metadata={"help": "relevance scorer"})
    query_dim: int = 384  # all-MiniLM-L6-v2
    hidden: int = 64  # context-weight MLP width: 3 outputs need little
    weights: str = field(default="auto", metadata={
        "help": "auto: the trained weights shipped in arr_coc/weights/ when they fit this scorer and channel "
                "set (else hand-set); none: always hand-set; or a file from `arr-coc train`"})
    # multiplies each part's context weight (propositional, perspectival, participatory) in the map:
    # 1 = as trained, 0 = that way of knowing off; an ablation knob (the microscope's sliders), never trained
    part_scale: tuple[float, float, float] = field(default=(1.0, 1.0, 1.0), metadata={
        "help": "scale of the propositional, perspectival and participatory parts: 1 = as trained, 0 = off"})


@dataclass
class SamplerConfig:
    # stratified keeps a token in every region (a second question about the footer is not starved)
    # while still spending most of the budget where relevance is high
    name: str = field(default="stratified", metadata={"help": "sampler name (see the list below)"})
    budget: int = field(default=DEFAULT_BUDGET, metadata={
        "help": "K saccades: full-resolution tokens sent besides the gestalt, whose tokens come on top",
        "metavar": "K"})
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ARRConfig:
    canvas: CanvasConfig = field(default_factory=CanvasConfig)
    texture: TextureConfig = field(default_factory=TextureConfig)
    gestalt: GestaltConfig = field(default_factory=GestaltConfig)
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    seed: int = 0  # initialises learnable parts and random samplers: same seed, same allocation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ARRConfig":
        """Rebuild from :meth:`to_dict` output (e.g. a checkpoint's saved config).

        >>> c = ARRConfig(sampler=SamplerConfig(budget=64), scorer=ScorerConfig(part_scale=(1.0, 0.0, 1.0)))
        >>> ARRConfig.from_dict(c.to_dict()) == c
        True
        """
        def tup(v):
            return tuple(v) if isinstance(v, list) else v

        return cls(
            canvas=CanvasConfig(**d.get("canvas", {})),
            texture=TextureConfig(**{k: tup(v) for k, v in d.get("texture", {}).items()}),
            gestalt=GestaltConfig(**{k: tup(v) for k, v in d.get("gestalt", {}).items()}),
            scorer=ScorerConfig(**{k: tup(v) for k, v in d.get("scorer", {}).items()}),
            sampler=SamplerConfig(**d.get("sampler", {})),
            seed=d.get("seed", 0),
        )
