"""arr-coc: query-aware visual token allocation for vision-language models."""

__version__ = "0.1.0"
