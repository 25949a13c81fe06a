"""The rules a question in a user's own words keeps: no content word of its answer, no phrase of its page.

Words are runs of letters and digits, compared case-folded (``\\makeindex`` is the word ``makeindex``,
``2019-12-17`` the words ``2019``, ``12`` and ``17``). A content word is any word not in
``STOP_WORDS`` (articles, pronouns, prepositions, auxiliaries, question words). A question quotes its
page when three consecutive words of it, at least one a content word, occur consecutively on the
page (``"is in it"`` is English, not a quote; ``"the default value"`` is a quote).
"""
from __future__ import annotations

import re

STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his i if in into is it its itself just me more most my
myself no nor not now of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom whose why will with would
you your yours yourself yourselves how s t one get gets got also may might must shall used use uses
using
""".split())


def words(text: str) -> list[str]:
    """The words of ``text``, case-folded: runs of letters and digits.

    >>> words("Which \\\\makeindex call, v2.02?")
    ['which', 'makeindex', 'call', 'v2', '02']
    """
    return [w.casefold() for w in re.findall(r"[^\W_]+", text)]


def content_words(text: str) -> set[str]:
    """The words of ``text`` that are not stop words.

    >>> sorted(content_words("Who wrote the package?"))
    ['package', 'wrote']
    """
    return {w for w in words(text) if w not in STOP_WORDS}


def quoted_phrase(question: str, page: str, n: int = 3) -> str | None:
    """The first run of ``n`` words of ``question`` (one or more a content word) that ``page`` holds; None if none.

    >>> quoted_phrase("Which command sets the default value?", "The default value is 4.")
    'the default value'
    >>> quoted_phrase("What is in it?", "All that is in it.") is None  # stop words only: English, not a quote
    True
    """
    page_words = words(page)
    grams = {tuple(page_words[i : i + n]) for i in range(len(page_words) - n + 1)}
    q = words(question)
    for i in range(len(q) - n + 1):
        gram = tuple(q[i : i + n])
        if gram in grams and any(w not in STOP_WORDS for w in gram):
            return " ".join(gram)
    return None


def found_on_page(answer: str, page: str) -> bool:
    """Whether ``answer`` is printed on the page: the same characters, case and all, spaces aside.

    Spaces are compared collapsed, then dropped (a text layer may split ``2007/09/25`` or join a
    word to its neighbour's punctuation differently from how it reads).

    >>> found_on_page("Barbara Beeton", "by  Barbara\\nBeeton, 2007"), found_on_page("beeton", "Beeton")
    (True, False)
    """
    def spaced(s: str) -> str:
        return " ".join(s.split())

    if spaced(answer) in spaced(page):
        return True
    return "".join(answer.split()) in "".join(page.split())
