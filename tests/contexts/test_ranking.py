"""The context ranking's near part: the answer's place next to a matched line, on a synthetic page and a context."""
from __future__ import annotations

import torch

from arr_coc import ARR, ARRConfig
from arr_coc.config import MVP_CHANNELS, TextureConfig
from arr_coc.contexts import allocate
from arr_coc.contexts.ranking import near_map
from arr_coc.documents.text_pages import TextLayout, render_text
from arr_coc.engine.channels.text import BELOW_WEIGHT
from arr_coc.engine.query import HashingQueryEncoder

# One heading "8.2 Accents in math", a body line right below it, a line far below (not lifted).
WORDS = [("8.2", (0.0, 0.0, 20.0, 50.0)), ("Accents", (0.0, 60.0, 20.0, 130.0)), ("in", (0.0, 140.0, 20.0, 160.0)),
         ("math", (0.0, 170.0, 20.0, 230.0)), ("body", (28.0, 0.0, 48.0, 100.0)), ("text", (28.0, 110.0, 48.0, 200.0)),
         ("far", (112.0, 0.0, 132.0, 60.0))]
LINES = [("8.2 Accents in math", (0.0, 0.0, 20.0, 230.0)), ("body text", (28.0, 0.0, 48.0, 200.0)),
         ("far", (112.0, 0.0, 132.0, 60.0))]
SIZE = (140, 280)  # 5 x 10 cells of 28 px


def test_near_map_lifts_the_rest_of_the_matched_line_and_the_line_below():
    got = near_map(WORDS, LINES, [1.0, 0, 0, 0, 0, 0, 0], SIZE, 28)
    want = torch.zeros(5, 10)
    want[0, 1:9] = 1.0  # "Accents in math": right of the matched "8.2" (x 50-230 touches cells 1..8); the key's cell 0 is not
    want[1, 0:8] = BELOW_WEIGHT  # "body text" (x 0-200: cells 0..7) below it; no gap right of the line (cell 9)
    torch.testing.assert_close(got, want)
    # controls: nothing matched lifts nothing; a match on the body line lifts its rest, not the line far below
    assert float(near_map(WORDS, LINES, [0.0] * 7, SIZE, 28).abs().sum()) == 0.0
    low = near_map(WORDS, LINES, [0, 0, 0, 0, 0.5, 0, 0], SIZE, 28)
    assert float(low[1, 4:8].min()) == 0.5 and float(low[4].abs().sum()) == 0.0 and float(low[0].abs().sum()) == 0.0


LAYOUT = TextLayout(size=14, width=280, height=224, margin=14)  # 10 x 8 cells of 28 px
FILLER = "\n".join(["lorem ipsum dolor sit amet"] * 6)


def _context():
    pages = [FILLER + "\n\n" * 4 for _ in range(3)]
    pages[1] = FILLER + "\nthe zanzibar harbour gate\nopens daily at dawn\n" + "\n\n" * 3
    return render_text("\n".join(pages), LAYOUT)


def test_near_weight_puts_the_saccades_on_the_line_after_a_quoted_phrase():
    ctx = _context()
    page = next(p for p in ctx.pages if any(w.text == "zanzibar" for w in p.words))
    answer = [w.box for w in page.words if w.text in ("opens", "daily", "at")]
    cells = {(y, x) for y0, x0, y1, x1 in answer for y in range(int(y0) // 28, int(y1 - 1) // 28 + 1)
             for x in range(int(x0) // 28, int(x1 - 1) // 28 + 1)}
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
    question = 'What comes after "zanzibar harbour gate"?'

    def covered(near_weight: float) -> set:
        # the exact-matching parts alone (the retrieval part would spread the few saccades over similar lines)
        out = allocate(arr, ctx, question, 2 * len(ctx.pages) + 12, near_weight=near_weight, retrieval_weight=0.0)
        assert out.tokens == 2 * len(ctx.pages) + 12  # the total stays exact
        p = next(p for p in out.pages if p.index == page.index)
        return cells & {tuple(c) for c in p.plan.cells.tolist()}

    assert covered(4.0) == cells  # every cell of the answer gets a saccade
    assert covered(0.0) != cells  # control: without the near part the ranking misses part of it


def test_a_quote_found_verbatim_names_its_page_though_its_one_content_word_is_everywhere():
    filler = "\n".join(["no lorem ipsum is no dolor"] * 6)
    pages = [filler + "\n\n" * 4 for _ in range(3)]
    pages[2] = filler + "\nand there is no\nzanzibar harbour gate\n" + "\n\n" * 3
    ctx = render_text("\n".join(pages), LAYOUT)
    needle = next(i for i, p in enumerate(ctx.pages) if any(w.text == "zanzibar" for w in p.words))
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()

    def saccades(question: str) -> list[int]:
        out = allocate(arr, ctx, question, 2 * len(ctx.pages) + 12, retrieval_weight=0.0)  # exact matching alone
        assert out.tokens == 2 * len(ctx.pages) + 12
        return [p.saccades for p in out.pages]

    quoted = saccades('What comes after "and there is no"?')
    assert quoted[needle] == sum(quoted) > 0  # every saccade on the page that holds the quote verbatim
    plain = saccades("What comes after and there is no?")  # control: the same words unquoted match "no" anywhere
    assert plain[needle] < sum(plain) == sum(quoted)
