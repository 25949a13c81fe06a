"""Documents as pages with their words: born-digital PDFs, plain text set on pages, a real corpus, questions.

``pdf`` renders PDF pages and reads their text layer; ``text_pages`` sets plain text on pages with
exact word boxes; both return a ``page.Context``. ``corpus`` lists the offline LaTeX manuals and
splits them by document; ``questions`` makes questions with answer boxes from the text layer.
"""
