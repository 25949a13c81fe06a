"""Configuration dataclasses, one per component; each default carries its reason.

A leaf: it imports no stage (only the token arithmetic of :mod:`arr_coc.budget`). Names (scorers,
samplers, channels) are checked against their registries where they are used: when an ``ARR`` is
built. Every field's ``metadata["help"]`` is its command-line help (``arr_coc.cli.options`` makes the
flags from it) and its line in the defaults table of docs/glossary.md.
"""
from __future__ import annotations

import math
import numbers
import operator
from dataclasses import asdict, dataclass, field
from typing import Any

from arr_coc.budget import gestalt_grid


def check_int(name: str, value: Any, low: int = 1) -> int:
    """``value`` as an int of at least ``low``, or a one-line error naming the option.

    Every option is checked where it enters the library (the configs' ``__post_init__``, the functions
    the CLI calls), so the API and the command line refuse the same values with the same message.

    >>> check_int("saccades", 16)
    16
    >>> check_int("saccades", "16")
    Traceback (most recent call last):
    ...
    TypeError: saccades must be an integer >= 1, got '16' (str)
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer >= {low}, got {value!r} (bool)")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer >= {low}, got {value!r} ({type(value).__name__})") from None
    if v < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {v}")
    if v >= 2**63:  # nothing counts that far, and torch's int64 cannot hold it
        raise ValueError(f"{name} must be below 2**63, got {v}")
    return v


def check_float(name: str, value: Any, low: float = 0.0, *, strict: bool = True) -> float:
    """``value`` as a finite float above ``low`` (or at least ``low`` when not ``strict``), else a one-line error.

    >>> import numpy as np
    >>> check_float("lr", 0.01), check_float("coverage_weight", 0, strict=False), check_float("w", np.float32(0.5))
    (0.01, 0.0, 0.5)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's scalars are Real too
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if not math.isfinite(v) or v < low or (strict and v == low):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {value!r}")
    return v


def resolve_dtype(dtype: Any) -> Any:
    """A model dtype option (None/"auto": the checkpoint's; "bfloat16", "float16", "float32" or a torch
    floating dtype) as a ``torch.dtype`` or None, else a one-line error.

    >>> resolve_dtype("bfloat16"), resolve_dtype(None)
    (torch.bfloat16, None)
    """
    import torch

    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return None if dtype == "auto" else dtype
    value = getattr(torch, dtype, None) if isinstance(dtype, str) and not dtype.startswith("_") else None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return value


def resolve_device(device: Any) -> Any:
    """A device option ("cpu", "cuda", "cuda:1", a ``torch.device``) that this torch can use, or a one-line error.

    >>> resolve_device("cpu"), resolve_device(None)
    (device(type='cpu'), None)
    """
    import torch

    if device is None:
        return None
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"unknown device {device!r}; e.g. cpu, cuda, cuda:1, mps") from None
    if d.type == "meta":
        raise ValueError("device 'meta' holds no data; use cpu or a GPU")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} is not available: this torch build has no CUDA support or sees no GPU; "
                         "use --device cpu (or install a CUDA build of torch)")
    if d.type != "cpu":
        try:
            torch.empty(1, device=d)
        except (RuntimeError, AssertionError) as err:  # e.g. cuda:7 on a one-GPU machine, or mps off macOS
            why = str(err).splitlines()[0].split(". ")[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"device {device!r} is not usable here ({why}); use --device cpu") from None
    return d


# The reference allocation: a 16x16 gestalt (256) + 273 saccades = 529 tokens, about a quarter of a
# 1344x1344 page at full resolution (2304 tokens at 28 px).
DEFAULT_SACCADES = 273

# Answers to the datasets' questions are a few words (a total, a date, a name); 32 new tokens hold any
# of them, and generation stops at the end-of-answer token anyway. ask, eval and serve share it.
MAX_NEW_TOKENS = 32

@dataclass
class DecodeConfig:
    """How the VLM writes its answer: the common settings of transformers' ``GenerationConfig``, checked here.

    ``ask`` turns it into a ``GenerationConfig`` (:func:`arr_coc.vlm.generation.from_decode`); every
    value is set, so nothing comes from the checkpoint's ``generation_config.json`` (Qwen-VL
    checkpoints sample there, with top_k 1).
    """

    # greedy: the evaluation compares methods on deterministic answers
    do_sample: bool = field(default=False, metadata={
        "help": "sample each answer token from the model's distribution instead of taking the most likely one"})
    # 1 and 1: the model's own distribution, untempered and untruncated
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature, > 0 (with --do-sample)", "metavar": "T"})
    top_p: float = field(default=1.0, metadata={
        "help": "nucleus sampling: draw from the most likely tokens whose probabilities add up to P, 0 < P <= 1 "
                "(with --do-sample)", "metavar": "P"})
    num_beams: int = field(default=1, metadata={"help": "beam search over N beams (1: none)", "metavar": "N"})
    stop: tuple[str, ...] = field(default=(), metadata={
        "help": "end the answer at the first of these strings (the string stays in it)", "metavar": "TEXT"})
    # None: each run draws anew, as transformers does without torch.manual_seed
    seed: int | None = field(default=None, metadata={
        "help": "seed of --do-sample's draws (none: torch's global generator)", "metavar": "N"})

    def __post_init__(self) -> None:
        self.temperature = check_float("temperature", self.temperature)
        self.top_p = check_float("top_p", self.top_p)
        if self.top_p > 1:
            raise ValueError(f"top_p must be a probability in (0, 1], got {self.top_p!r}")
        self.num_beams = check_int("num_beams", self.num_beams)
        if self.seed is not None:
            self.seed = check_int("seed", self.seed, 0)
        if not self.do_sample and (self.temperature, self.top_p) != (1.0, 1.0):
            raise ValueError("temperature and top_p shape sampling; add do_sample (--do-sample)")
        if not self.do_sample and self.seed is not None:  # greedy decoding draws nothing: the seed would go unused
            raise ValueError("seed seeds sampling's draws, and greedy decoding draws none; add do_sample "
                             "(--do-sample) or drop the seed")
        self.stop = tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty text, got {list(self.stop)!r}")


# The 11 query-blind channel groups (13 channels) of the MVP texture (arr_coc.engine.pixel_channels registers them).
MVP_CHANNELS: tuple[str, ...] = (
    "rgb", "y", "x", "eccentricity", "edges", "edges_inv", "highpass", "lowpass", "motion", "saliency", "distance",
)


# A question, not a document, bounded in tokens: in the VLM's tokens where a VLM reads it (ask, the first
# look), else in words and punctuation marks (arr_coc.engine.query.count_tokens, a lower bound on any subword
# tokenizer's count). The VLM prefills the question over its whole context, so its cost grows with the
# question (a 100,000-character question took 19.6 GB); benchmark questions are under 40 tokens. The
# first look reads attention from at most arr_coc.vlm.first_look.LOOK_TOKENS of them, whatever the limit.
MAX_QUESTION_TOKENS = 128
# The largest canvas area: 16384 tokens of 28 px (12.8 MP), Qwen2/2.5-VL's own processor maximum. The
# texture grows with the area (< 0.5 GB at the default 1792 x 1792), about 2 GB here.
MAX_CANVAS_PIXELS = 16384 * 28 * 28


@dataclass
class CanvasConfig:
    # one LLM token = 2x2 merged 14 px patches (Qwen2/2.5-VL); 32 for Qwen3-VL
    cell: int = field(default=28, metadata={"help": "token cell in px: 28 for Qwen2/2.5-VL, 32 for Qwen3-VL"})
    min_pixels: int = field(default=56 * 56, metadata={"help": "smallest canvas area in px"})  # Qwen's: 2x2 tokens
    # 4096 full-resolution tokens: A4 pages stay legible, texture stays < 0.5 GB
    max_pixels: int = field(default=1792 * 1792, metadata={"help": "largest canvas area in px"})

    def __post_init__(self) -> None:
        self.cell = check_int("cell", self.cell)
        self.min_pixels = check_int("min_pixels", self.min_pixels)
        self.max_pixels = check_int("max_pixels", self.max_pixels, self.cell * self.cell)
        if self.max_pixels > MAX_CANVAS_PIXELS:
            raise ValueError(f"max_pixels {self.max_pixels} is above the largest canvas, {MAX_CANVAS_PIXELS} px "
                             f"(16384 tokens of 28 px, the Qwen-VL processors' maximum); give --max-pixels "
                             f"{MAX_CANVAS_PIXELS} or less")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels {self.min_pixels} exceeds max_pixels {self.max_pixels}")

    @property
    def max_tokens(self) -> int:
        return self.max_pixels // (self.cell * self.cell)


# The 13-channel MVP texture plus the channels that helped at equal tokens in the ablation (README):
# the text channels on forms and receipts (one OCR pass per image, ~2 s on two CPU cores; silent on
# photos without text) and learned saliency on all three datasets (~0.6 s per image).
PIPELINE_CHANNELS = MVP_CHANNELS + ("text_match", "key_value", "learned_saliency")


@dataclass
class TextureConfig:
    # None = PIPELINE_CHANNELS; MVP_CHANNELS is the query-blind 13-channel MVP
    channels: tuple[str, ...] | None = field(default=None, metadata={
        "help": "texture channels; 'mvp' = the 13-channel MVP, 'default' = mvp + text_match key_value "
                "learned_saliency (the default), e.g. --channels mvp objects (see the list below)",
        "metavar": "NAME"})
    # per-channel settings, e.g. {"clip": {"model": "/path/to/clip"}}
    options: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": 'per-channel settings, e.g. {"clip": {"model": PATH}} (the CLI: --clip-model)'})


@dataclass
class GestaltConfig:
    grid: tuple[int, int] | None = field(default=None, metadata={
        "help": "(rows, cols) of gestalt tokens, clamped to the image's cell grid; none: the rule under "
                "saccades (the CLI: --gestalt N for N x N)"})

    def __post_init__(self) -> None:
        if self.grid is not None:
            if isinstance(self.grid, (str, bytes)) or not hasattr(self.grid, "__len__") or len(self.grid) != 2:
                raise ValueError(f"gestalt grid must be (rows, cols), got {self.grid!r}")
            self.grid = (check_int("gestalt rows", self.grid[0]), check_int("gestalt cols", self.grid[1]))

    def grid_for(self, saccades: int, cells_hw: tuple[int, int]) -> tuple[int, int]:
        """Gestalt grid sent with ``saccades`` saccade tokens on an image of ``cells_hw`` token cells.

        >>> GestaltConfig().grid_for(273, (48, 48)), GestaltConfig(grid=(4, 6)).grid_for(64, (48, 48))
        ((16, 16), (4, 6))
        """
        if self.grid is None:
            return gestalt_grid(saccades, cells_hw)
        return min(self.grid[0], cells_hw[0]), min(self.grid[1], cells_hw[1])


@dataclass
class ScorerConfig:
    # the three-way scorer (relevance.py); "mvp" is the 86-weight baseline scorer
    name: str = field(default="contextual", metadata={"help": "relevance scorer (see the list below)"})
    query_dim: int = field(default=384, metadata={  # all-MiniLM-L6-v2
        "help": "width of the question embedding (the query encoder's; 384 for all-MiniLM-L6-v2)"})
    hidden: int = field(default=64, metadata={  # 3 outputs need little
        "help": "width of the context-weight MLP"})
    weights: str = field(default="auto", metadata={
        "help": "auto: the trained weights shipped in arr_coc/weights/ when they fit this scorer and channel "
                "set (else hand-set); none: always hand-set; a shipped name (log_polar); or a weights folder "
                "(model.safetensors + config.json) from `arr-coc train` or save_pretrained"})
    # multiplies each part's context weight (propositional, perspectival, participatory) in the map:
    # 1 = as trained, 0 = that way of knowing off; an ablation knob (the microscope's sliders), never trained
    part_scale: tuple[float, float, float] = field(default=(1.0, 1.0, 1.0), metadata={
        "help": "scale of the propositional, perspectival and participatory parts: 1 = as trained, 0 = off"})
    # the query-weighted where prior (relevance.where_basis): where on the image a question's answer lay in
    # the training layouts. Off by default: on unseen layouts (LaTeX manual pages) it pulled "What is the
    # page number?" to the top of the page and read worse than the same scorer without it (docs/defaults.md)
    where_prior: float = field(default=0.0, metadata={
        "help": "scale of the trained where prior (where answers lay in the training layouts): 0 = off, 1 = as trained"})

    def __post_init__(self) -> None:
        self.query_dim, self.hidden = check_int("query_dim", self.query_dim), check_int("hidden", self.hidden)
        if not isinstance(self.weights, str):
            raise TypeError(f"scorer weights must be 'auto', 'none' or a file path, got {self.weights!r}")
        if not self.weights.strip():
            raise ValueError("scorer weights are empty; pass auto, none or a file path")
        if not (isinstance(self.where_prior, (int, float)) and 0 <= self.where_prior < float("inf")):
            raise ValueError(f"where_prior must be a finite number >= 0 (0 = off, 1 = as trained), got {self.where_prior!r}")


@dataclass
class SamplerConfig:
    # top-K of the trained scorer: on validation forms, receipts and photos it read at least as well as
    # stratified, NMS and the uniformly downsampled image (docs/defaults.md); stratified, which reserves
    # tokens for every region, read worse than the uniform image on receipts
    name: str = field(default="topk", metadata={"help": "sampler name (see the list below)"})
    saccades: int = field(default=DEFAULT_SACCADES, metadata={
        "help": "K saccades: full-resolution tokens sent besides the gestalt, whose tokens come on top: a square "
                "gestalt, the largest side of 16, 12, 8, 6, 4, 2, 1 with side*side <= K (273 -> 16x16, 529 in all; "
                "128 -> 8x8), each side clamped to the image's cell grid (a 10x40-cell image gets a 10x16 "
                "gestalt); an image with fewer than K cells is refused with its count",
        "metavar": "K"})
    kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "the sampler's own settings, e.g. {\"min_distance\": 3} for nms"})

    def __post_init__(self) -> None:
        self.saccades = check_int("saccades", self.saccades)


@dataclass
class ARRConfig:
    canvas: CanvasConfig = field(default_factory=CanvasConfig)
    texture: TextureConfig = field(default_factory=TextureConfig)
    gestalt: GestaltConfig = field(default_factory=GestaltConfig)
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    # same seed, same allocation
    seed: int = field(default=0, metadata={"help": "seed of the learnable parts' initialisation and of random samplers"})

    def __post_init__(self) -> None:
        self.seed = check_int("seed", self.seed, 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ARRConfig":
        """Rebuild from :meth:`to_dict` output (e.g. a checkpoint's saved config).

        >>> c = ARRConfig(sampler=SamplerConfig(saccades=64), scorer=ScorerConfig(part_scale=(1.0, 0.0, 1.0)))
        >>> ARRConfig.from_dict(c.to_dict()) == c
        True
        """
        def tup(v):
            return tuple(v) if isinstance(v, list) else v

        sampler = dict(d.get("sampler", {}))
        if "budget" in sampler:  # files written before K was named saccades
            sampler["saccades"] = sampler.pop("budget")

        return cls(
            canvas=CanvasConfig(**d.get("canvas", {})),
            texture=TextureConfig(**{k: tup(v) for k, v in d.get("texture", {}).items()}),
            gestalt=GestaltConfig(**{k: tup(v) for k, v in d.get("gestalt", {}).items()}),
            scorer=ScorerConfig(**{k: tup(v) for k, v in d.get("scorer", {}).items()}),
            sampler=SamplerConfig(**sampler),
            seed=d.get("seed", 0),
        )
