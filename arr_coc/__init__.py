"""arr-coc: query-aware visual token allocation for vision-language models.

Importing the package registers every built-in texture channel, scorer and sampler.
"""

from importlib.metadata import PackageNotFoundError, version

try:  # the installed distribution's version: pyproject.toml is its one source
    __version__ = version("arr-coc")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"

from arr_coc.config import ARRConfig, CanvasConfig, GestaltConfig, SamplerConfig, ScorerConfig  # noqa: E402
from arr_coc.engine import channels, learned_samplers, relevance, samplers, texture  # noqa: E402,F401  (fill the registries)
from arr_coc.engine.pipeline import ARR, Allocation  # noqa: E402

__all__ = ["ARR", "ARRConfig", "Allocation", "CanvasConfig", "GestaltConfig", "SamplerConfig", "ScorerConfig"]
