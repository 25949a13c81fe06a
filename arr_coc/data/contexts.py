"""Context datasets: questions over whole contexts of many pages, each knowing the page(s) that hold its answer.

Two kinds of :class:`ContextItem` (a context and its questions), both evaluated by
:func:`arr_coc.eval.evaluate.evaluate` (``arr-coc eval texlive-contexts|mpdocvqa|slidevqa``):

- :func:`texlive_contexts`: the long-context questions of the LaTeX manuals
  (:mod:`arr_coc.documents.corpus`, split by document family): the first ``pages`` pages of every
  document of the split with at least that many, as the PDF rendered at ``dpi`` with its text layer
  (``source="pdf"``) or as that text layer re-set on pages by
  :func:`~arr_coc.documents.text_pages.render_text` (``source="text"``); questions by
  :func:`~arr_coc.documents.questions.context_questions` (section titles and next words, each answer
  once in the context and never in its question), with the answer's boxes on its page;
- :func:`record_contexts`: multi-page records (``Record.pages``: MP-DocVQA, SlideVQA), grouped by
  their pages, so every question over one document sees the pages once; no answer boxes.

A context is loaded only when it is evaluated (``ContextItem.load``), so a long list costs one
context's pages at a time, and a resumed run renders no context whose questions are all done.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, Union

from arr_coc.data.boxes import Box
from arr_coc.data.datasets import DatasetSpec, Record, register

TEXLIVE_CONTEXTS = "texlive-contexts"  # the dataset name of arr-coc eval
CONTEXT_SOURCES = ("pdf", "text")
CONTEXT_DPI = 100.0  # 10 pt body text ~14 px high: 20 A4 pages cost ~25,000 tokens at full resolution


@dataclass(frozen=True)
class ContextQuestion:
    """One question over a context.

    Attributes:
        record_id: unique within the dataset, stable across runs (rows are keyed by it).
        question: the question.
        answers: accepted answers (the first as printed).
        pages: 0-based positions in the context of the page(s) holding the answer.
        boxes: the answer's boxes on ``pages[0]`` in that page's pixels (y0, x0, y1, x1); () when unknown.
        kind: the question's kind (``section_title``, ``next_words``; "" = one kind).
        found: without ``boxes``, the answer's occurrences found on the text layer of ``pages[0]``, each its
            words' boxes; the best-read occurrence counts.
    """

    record_id: str
    question: str
    answers: tuple[str, ...]
    pages: tuple[int, ...]
    boxes: tuple[Box, ...] = ()
    kind: str = ""
    found: tuple[tuple[Box, ...], ...] = ()


@dataclass
class ContextItem:
    """A context and the questions asked of it.

    Attributes:
        dataset: the dataset's name (rows' ``dataset``).
        context_id: unique within the dataset (rows' ``image_id``).
        load: returns what :func:`arr_coc.contexts.see_context` takes: a ``Context`` or page image paths.
        questions: the questions, in a stable order.
        group: the split group (a document family, a document).
    """

    dataset: str
    context_id: str
    load: Callable[[], Any]
    questions: list[ContextQuestion] = field(default_factory=list)
    group: str = ""


def _question_id(context_id: str, page: int, kind: str, question: str) -> str:
    digest = hashlib.sha256(question.encode()).hexdigest()[:10]
    return f"{context_id}#p{page + 1}#{kind}#{digest}"


def corpus_pdfs(root: Union[str, os.PathLike, None]) -> tuple[list[Path] | None, Path | None]:
    """The PDFs of ``--data`` (a PDF or a folder searched for them) and the root their names are taken from;
    (None, None) for the installed corpus."""
    if root is None:
        return None, None
    root = Path(root)
    if root.is_file():
        return [root], root.parent
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is neither a PDF nor a folder of PDFs; pass --data PDF_OR_DIR")
    found = sorted(root.rglob("*.pdf"))
    if not found:
        raise ValueError(f"no .pdf file under {root}; pass a folder of PDFs with a text layer")
    return found, root


def texlive_contexts(split: str | None = None, *, pages: int = 20, source: str = "pdf", dpi: float = CONTEXT_DPI,
                     questions: int = 8, n_docs: int | None = None, seed: int = 0,
                     root: Union[str, os.PathLike, None] = None) -> Iterator[ContextItem]:
    """The long-context questions: the first ``pages`` pages of each document, with ``questions`` questions each.

    Args:
        split: the corpus's split by document family (``train``, ``val``, ``test``; None: all).
        pages: pages per context; documents with fewer are left out.
        source: ``pdf`` (rendered at ``dpi``, text layer) or ``text`` (the text layer re-set on pages).
        dpi: the PDF's render resolution.
        questions: questions per context (fewer where the context has fewer).
        n_docs: the first documents by name (None: all).
        seed: which questions are drawn.
        root: a PDF or a folder of PDFs instead of the installed corpus (split by family alike).

    Returns:
        One :class:`ContextItem` per document that has a question, in name order, made as they are taken
        (the options and the document list are checked at once).
    """
    from arr_coc.documents.corpus import documents
    from arr_coc.documents.page import Context
    from arr_coc.documents.pdf import read_pdf
    from arr_coc.documents.text_pages import TextLayout, render_text

    if source not in CONTEXT_SOURCES:
        raise ValueError(f"unknown context source {source!r}; choose one of {', '.join(CONTEXT_SOURCES)}")
    if isinstance(pages, bool) or not isinstance(pages, int) or pages < 1:
        raise ValueError(f"--window must be a whole number of pages, at least 1, got {pages!r}")
    if isinstance(questions, bool) or not isinstance(questions, int) or questions < 1:
        raise ValueError(f"--questions must be a whole number, at least 1, got {questions!r}")
    if n_docs is not None and (isinstance(n_docs, bool) or not isinstance(n_docs, int) or n_docs < 1):
        raise ValueError(f"--contexts must be a whole number of documents, at least 1, got {n_docs!r}")
    paths, base = corpus_pdfs(root)
    docs = documents(paths, split=split) if base is None else documents(paths, root=base, split=split)
    docs = sorted((d for d in docs if d.n_pages >= pages), key=lambda d: d.name)[:n_docs]

    def made(doc: Any, render: bool) -> Any:
        pdf = read_pdf(doc.path, pages=f"1-{pages}", dpi=dpi, render=render)
        if source == "pdf":
            return pdf
        ctx = render_text("\n".join(p.text for p in pdf.pages), TextLayout(), f"{doc.name} (text)")
        return Context(ctx.pages[:pages], ctx.source, ctx.meta)

    return _items(docs, made, source, pages, questions, seed)


def _items(docs: list, made: Callable[[Any, bool], Any], source: str, pages: int, questions: int,
           seed: int) -> Iterator[ContextItem]:
    from arr_coc.documents.questions import context_questions

    for doc in docs:
        ctx = made(doc, False)  # the text layer alone: questions without rendering the PDF
        context_id = f"{doc.name}#{source}#{pages}p"
        first = ctx.pages[0].index
        qs = [ContextQuestion(_question_id(context_id, q.page, q.kind, q.question), q.question, tuple(q.answers),
                              (q.page - first,), tuple(q.boxes), q.kind)
              for q in context_questions(ctx, questions, seed=seed)]
        if qs:
            # a re-set text is rendered already; a PDF's pages are rendered when the context is evaluated
            load = (lambda c=ctx: c) if source == "text" else (lambda d=doc: made(d, True))
            yield ContextItem(TEXLIVE_CONTEXTS, context_id, load, qs, doc.family)


def texlive_context_set(root: Union[str, os.PathLike, None] = None, *, split: str | None = None,
                        limit: int | None = None, seed: int = 0, window: int | None = None, source: str | None = None,
                        dpi: float | None = None, questions: int | None = None,
                        contexts: int | None = None) -> tuple[Iterator[ContextItem], dict, str]:
    """``texlive-contexts`` as a :class:`~arr_coc.data.datasets.DatasetSpec` reads it: (contexts, how they were made,
    the output subfolder: the source); the options are ``arr-coc eval``'s, None = their defaults.

    The first context is made at once, so that options that leave no question say so before any work.
    """
    import itertools

    if limit is not None:
        raise ValueError(f"--limit counts records; {TEXLIVE_CONTEXTS} takes --contexts N (documents) and "
                         f"--questions Q (per document)")
    source, pages = source or "pdf", 20 if window is None else window
    made = {"split": split, "source": source, "pages": pages, "dpi": CONTEXT_DPI if dpi is None else dpi,
            "questions": 8 if questions is None else questions, "seed": seed,
            "data": None if root is None else str(root)}
    items = iter(texlive_contexts(split, pages=pages, source=source, dpi=made["dpi"], questions=made["questions"],
                                  n_docs=contexts, seed=seed, root=root))
    first = next(items, None)
    if first is None:
        raise ValueError(f"no context of {TEXLIVE_CONTEXTS} has a question with these options (documents with at "
                         f"least {pages} pages" + (f" of the {split} split" if split else "") + ")")
    return itertools.chain([first], items), made, source


def ocr_only(name: str) -> Callable[..., list[Record]]:
    """The ``load`` of a dataset of contexts without records for the VLM: it says which readers read it."""
    def load(root: Any = None, split: Any = None) -> list[Record]:
        raise ValueError(f"{name} is read by an OCR reader (--reader tesseract or rapidocr); the VLM reads "
                         f"mpdocvqa and slidevqa contexts")
    return load


TEXLIVE_CONTEXTS_SPEC = register(DatasetSpec(
    TEXLIVE_CONTEXTS, "TeX Live contexts", ocr_only(TEXLIVE_CONTEXTS), splits="official", contexts=texlive_context_set,
    context_options=("window", "source", "dpi", "questions", "contexts"), documents_of="texlive"))


def record_contexts(records: Sequence[Record]) -> list[ContextItem]:
    """Multi-page records (``Record.pages``) grouped by their pages: one context per document or deck.

    Raises:
        ValueError: a record has no pages, or no answer page (MP-DocVQA's hidden test split).
    """
    groups: dict[tuple[Path, ...], list[Record]] = {}
    for r in records:
        if not r.pages:
            raise ValueError(f"record {r.record_id} is one image, not a context; evaluate it without the context "
                             f"options (or with --reader vlm)")
        if not r.answer_pages:
            raise ValueError(f"record {r.record_id} names no answer page (a hidden test split?), which the page "
                             f"hit needs; choose --split val")
        groups.setdefault(tuple(r.pages), []).append(r)
    items, ids = [], set()
    for pages, recs in groups.items():
        context_id = recs[0].image_id if recs[0].image_id not in ids else f"{recs[0].image_id}#{len(ids)}"
        ids.add(context_id)
        qs = [ContextQuestion(r.record_id, r.question, r.references, tuple(r.answer_pages), kind=r.kind) for r in recs]
        items.append(ContextItem(recs[0].dataset, context_id, lambda p=pages: [str(x) for x in p], qs,
                                 recs[0].split_group))
    return items
