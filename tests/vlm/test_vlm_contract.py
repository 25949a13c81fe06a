"""The VLM adapter contract, run over every registered adapter: a new family is tested here for free.

Each adapter runs on its tiny random-weight model (``load_vlm("tiny:<name>")``). Every exactness
test carries a negative control: the same comparison with deliberately wrong positions or masks
must fail, so a test cannot pass because the model ignores them. Family-specific behaviour (Qwen's
patch rows and windows, LLaVA's tiles) stays in test_vlm_qwen.py and test_vlm_llava.py.
"""
from dataclasses import replace

import pytest
import torch
from conftest import check_batch_equals_singles
from PIL import Image
from tolerances import VLM_EMBEDS, VLM_LOGITS, assert_close_reduction, assert_far, reduction_atol
from transformers import GenerationConfig

from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.vlm import ADAPTERS, LAYOUTS, ask, assemble, encode, generate, load_vlm, prefill
from arr_coc.vlm.processing import all_cells
from arr_coc.vlm.protocol import CAPABILITIES, FIRST_LOOK, PROCESSOR, VLMAdapter

# the grid whose every cell the model's own forward sees at full resolution (LLaVA: exactly one S x S tile)
NATIVE_GRID = {"llava": (4, 4)}
# the pages of a context whose every cell the model's own multi-image forward sees (LLaVA: one tile each)
PAGE_GRIDS = {"llava": [(4, 4)] * 3}


@pytest.fixture(scope="module", params=ADAPTERS.names())
def adapter(request) -> VLMAdapter:
    return load_vlm(f"tiny:{request.param}")


def image(adapter, hc, wc, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=g)


def prefill_for(adapter, questions, visuals):
    prompts = [adapter.prompt_ids(q) for q in questions]
    return assemble(adapter.embed_tokens, [p[0] for p in prompts], visuals, [p[1] for p in prompts], adapter.rope_rows)


def run_llm(adapter, pf, position_ids=None):
    x = dict(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask, visual_mask=pf.visual_mask,
             position_ids=pf.position_ids if position_ids is None else position_ids, deepstack=pf.deepstack)
    with torch.no_grad():
        return adapter.logits(adapter.language_model(x))


def native_logits(adapter, images, questions):
    with torch.no_grad():
        return adapter.model(**adapter.native_inputs(images, questions)).logits


def reversed_visual_positions(pf):
    """The prefill's positions with its visual tokens' positions in reverse order (a negative control)."""
    wrong = pf.position_ids.clone()
    vis = pf.visual_mask[0]
    wrong[:, 0, vis] = wrong[:, 0, vis].flip(-1)
    return wrong


# ----------------------------------------------------------------------------- the declaration itself


def test_capabilities_and_layouts_are_declared_from_the_known_sets(adapter):
    assert isinstance(adapter, VLMAdapter) and ADAPTERS.get(adapter.name) is type(adapter)
    assert adapter.capabilities <= set(CAPABILITIES) and set(adapter.layouts) <= set(LAYOUTS)
    assert "scaled" in adapter.layouts
    # a declared capability is implemented (overridden), an undeclared one is the protocol's refusal
    for capability, method in ((FIRST_LOOK, "encode_gestalt"), (PROCESSOR, "encode_processed")):
        overridden = getattr(type(adapter), method) is not getattr(VLMAdapter, method)
        assert overridden == (capability in adapter.capabilities)


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("mode", ["sparse", "slice", "weighted"])
def test_every_cell_reproduces_the_native_forward(adapter, mode):
    hc, wc = NATIVE_GRID.get(adapter.name, (5, 7))
    img, q = image(adapter, hc, wc), "What is the total?"
    ref = native_logits(adapter, [img], [q])
    weights = [torch.ones(hc, wc)] if mode == "weighted" else None
    vis = adapter.encode([img], [all_cells(hc, wc)], mode=mode, weights=weights)
    assert len(vis[0]) == hc * wc and vis[0].n_gestalt == 0
    pf = prefill_for(adapter, [q], vis)
    atol = assert_close_reduction(run_llm(adapter, pf), ref, **VLM_LOGITS)
    # the stages' full plan is the same encoding
    staged = encode(adapter, [Plan("full", "full", (hc, wc))], [img])
    assert_close_reduction(staged[0].embeds, adapter.encode_native([img])[0].embeds, **VLM_EMBEDS)
    # negative control: the same tokens with their positions reversed
    assert_far(run_llm(adapter, pf, reversed_visual_positions(pf)), ref, atol=atol)
    if adapter.rope_rows == 3:  # M-RoPE: and with h and w swapped
        wrong = pf.position_ids.clone()
        wrong[1:, :, pf.visual_mask[0]] = wrong[[2, 1]][:, :, pf.visual_mask[0]]
        assert_far(run_llm(adapter, pf, wrong), ref, atol=atol)


def test_sparse_subset_is_order_free_and_differs_from_slice(adapter):
    img = image(adapter, 7, 9, seed=3)
    cells = torch.tensor([[6, 8], [0, 0], [2, 3], [3, 2], [0, 5], [4, 4]])
    a = adapter.encode([img], [cells], mode="sparse")[0]
    perm = torch.tensor([3, 0, 5, 4, 1, 2])
    b = adapter.encode([img], [cells[perm]], mode="sparse")[0]
    atol = assert_close_reduction(b.embeds, a.embeds[perm], **VLM_EMBEDS)
    if adapter.rope_rows == 3:  # M-RoPE positions travel with their cells (a 1-D RoPE counts tokens in sequence)
        assert torch.equal(b.positions, a.positions[:, perm])
    # the tower saw 6 cells, not the whole grid or tile: a different context, different tokens
    assert_far(adapter.encode([img], [cells], mode="slice")[0].embeds, a.embeds, atol=atol)


@pytest.mark.parametrize("gestalt", [None, (4, 4)])
def test_size_one_squares_are_exactly_the_sparse_saccades(adapter, gestalt):
    img = image(adapter, 7, 9, seed=11)
    cells = torch.tensor([[6, 8], [0, 0], [2, 3], [3, 2], [0, 5], [4, 4]])
    boxes = torch.cat([cells, torch.ones(len(cells), 1, dtype=torch.long)], 1)
    ref = adapter.encode([img], [cells], mode="sparse", gestalt=[gestalt])[0]
    vis = adapter.encode_patches([img], [boxes], gestalt=[gestalt])[0]
    assert (vis.n_gestalt, len(vis)) == (ref.n_gestalt, len(ref)) and len(ref) == ref.n_gestalt + 6
    assert vis.vision_segments == ref.vision_segments and vis.positions.tolist() == ref.positions.tolist()
    atol = assert_close_reduction(vis.embeds, ref.embeds, **VLM_EMBEDS)
    # negative control: the same cells encoded inside their full grid or tiles (slice) are other tokens
    sliced = adapter.encode([img], [cells], mode="slice", gestalt=[gestalt])[0]
    assert_far(vis.embeds[vis.n_gestalt:], sliced.embeds[sliced.n_gestalt:], atol=atol)


# ----------------------------------------------------------------------------- several images in one prompt


def pages(adapter, seed=20):
    """The pages of a context, as uint8 pixels (so the model's image processor reads exactly these values)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, h * adapter.cell, w * adapter.cell), generator=g).float() / 255
            for h, w in PAGE_GRIDS.get(adapter.name, [(3, 4), (5, 2), (2, 3)])]


def every_cell(page, cell):
    grid = (page.shape[1] // cell, page.shape[2] // cell)
    return Plan("every cell", "cells", grid, cells=all_cells(*grid))


def context_logits(adapter, imgs, question, order=None):
    """The sparse multi-image prompt (every cell of every page, each page its own tower segment)."""
    order = order or range(len(imgs))
    vis = encode(adapter, [every_cell(imgs[i], adapter.cell) for i in order], [imgs[i] for i in order])
    return run_llm(adapter, prefill(adapter, [vis], [adapter.prompt_segments(question, len(vis))]).prefill)


def test_every_cell_of_every_page_reproduces_the_native_multi_image_forward(adapter):
    imgs, q = pages(adapter), "Which page?"
    inputs = adapter.native_inputs([imgs], [q])
    if PROCESSOR in adapter.capabilities:  # the reference's pixels and grids are the image processor's own
        photos = [Image.fromarray((p * 255).round().byte().permute(1, 2, 0).numpy()) for p in imgs]
        processed = adapter.image_processor()(images=photos, return_tensors="pt")
        assert processed["image_grid_thw"].tolist() == inputs["image_grid_thw"].tolist()
        assert torch.equal(processed["pixel_values"], inputs["pixel_values"])
    assert int((inputs["input_ids"] == adapter.image_token_id).sum()) == sum(
        len(v) for v in encode(adapter, [every_cell(p, adapter.cell) for p in imgs], imgs))
    with torch.no_grad():
        ref = adapter.model(**inputs).logits
    atol = assert_close_reduction(context_logits(adapter, imgs, q), ref, **VLM_LOGITS)
    # negative control: two pages swapped (same tokens, same prompt, other order)
    assert_far(context_logits(adapter, imgs, q, order=[1, 0, 2]), ref, atol=atol)


def test_one_page_context_is_exactly_the_one_image_prompt(adapter):
    img, q = image(adapter, 5, 4, seed=8), "Total?"
    plan = Plan("arr", "cells", (5, 4), gestalt=(2, 2), cells=torch.tensor([[4, 3], [0, 1]]))
    vis = encode(adapter, [plan], [img])
    one, ctx = prefill(adapter, vis, [adapter.prompt_ids(q)]).prefill, prefill(
        adapter, [vis], [adapter.prompt_segments(q, 1)]).prefill
    for name in ("inputs_embeds", "attention_mask", "position_ids", "next_position", "visual_mask"):
        assert torch.equal(getattr(one, name), getattr(ctx, name)), name


def test_context_prompts_of_different_page_counts_batch_like_each_alone(adapter):
    imgs = pages(adapter, seed=21)
    plans = [Plan("arr", "cells", (p.shape[1] // adapter.cell, p.shape[2] // adapter.cell), gestalt=(2, 2),
                  cells=torch.tensor([[1, 1], [0, 0]])) for p in imgs]
    plans[1] = replace(plans[1], cells=torch.zeros(0, 2, dtype=torch.long))  # a page with its gestalt alone
    vis = encode(adapter, plans, imgs)
    assert [len(v) - v.n_gestalt for v in vis] == [2, 0, 2]
    groups, questions = [vis[:1], vis[1:]], ["Date?", "Which total is larger?"]
    texts = [adapter.prompt_segments(q, len(g)) for q, g in zip(questions, groups)]
    batch = prefill(adapter, groups, texts).prefill
    singles = [prefill(adapter, [g], [t]).prefill for g, t in zip(groups, texts)]
    check_batch_equals_singles(adapter, batch, singles, run_llm)


# ----------------------------------------------------------------------------- decoding (the model's own generate) and batching


def manual_decode(adapter, pf, steps, shift=0.0):
    """Recompute the whole sequence each step, no cache; ``shift`` moves the generated positions."""
    emb, mask, pos, tokens, logits = pf.inputs_embeds, pf.attention_mask, pf.position_ids, [], []
    for step in range(steps):
        pad = pf.visual_mask.new_zeros(len(mask), mask.shape[1] - pf.visual_mask.shape[1])  # generated: not visual
        vmask = torch.cat([pf.visual_mask, pad], 1)
        out = run_llm(adapter, replace(pf, inputs_embeds=emb, attention_mask=mask, position_ids=pos,
                                       visual_mask=vmask))[:, -1]
        nxt = out.argmax(-1)
        tokens.append(nxt)
        logits.append(out)
        emb = torch.cat([emb, adapter.embed_tokens(nxt[:, None])], 1)
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], 1)
        p = (pf.next_position + step + shift)[None, :, None].expand(adapter.rope_rows, -1, 1)
        pos = torch.cat([pos, p], 2)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def encodings(adapter, img, cells):
    """Every layout and encoding the adapter supports, as (name, visual tokens) of one image."""
    boxes = torch.tensor([[4, 3, 2], [1, 1, 1], [0, 2, 2]])  # (y, x, side) squares, one token each
    for layout in adapter.layouts:
        for mode in ("sparse", "slice"):
            yield f"{layout} {mode}", adapter.encode([img], [cells], mode=mode, gestalt=[(3, 3)], layout=layout)
        yield f"{layout} squares", adapter.encode_patches([img], [boxes], gestalt=[(3, 3)], layout=layout)
    hc, wc = img.shape[1] // adapter.cell, img.shape[2] // adapter.cell
    yield "weighted", adapter.encode([img], [cells], mode="weighted", weights=[torch.linspace(0.5, 1, hc * wc)
                                                                               .view(hc, wc)])


def check_greedy(adapter, pf, steps=5, **kwargs):
    """generate's greedy tokens and logits equal the cache-free reference up to its end token; returns them."""
    tokens, logits = generate(adapter, pf, max_new_tokens=steps, **kwargs)
    ref_tokens, ref_logits = manual_decode(adapter, pf, steps)
    n = tokens.shape[1]
    assert tokens.tolist() == ref_tokens[:, :n].tolist()
    assert n == steps or tokens[0, -1].item() == adapter.text_config.eos_token_id
    assert_close_reduction(logits, ref_logits[:, :n], **VLM_LOGITS)
    return tokens, logits


def test_generate_equals_the_greedy_reference_in_every_layout_and_encoding(adapter):
    """transformers' generate from the prompt's explicit positions decodes what a cache-free greedy loop does."""
    img = image(adapter, 6, 5, seed=3)
    cells = torch.tensor([[5, 4], [1, 1], [3, 0], [0, 4]])
    seen = {}
    for name, vis in encodings(adapter, img, cells):
        pf = prefill_for(adapter, ["Date?"], vis)
        seen[name] = (pf, check_greedy(adapter, pf)[1])
    assert len(seen) == 3 * len(adapter.layouts) + 1
    # negative control: the same tokens at another layout's positions (LLaVA's one layout: reversed) differ
    pf, logits = seen[f"{adapter.layouts[0]} sparse"]
    atol = reduction_atol(logits, **VLM_LOGITS)
    if len(adapter.layouts) > 1:
        other = seen[f"{adapter.layouts[1]} sparse"][0]
        assert_close_reduction(other.inputs_embeds, pf.inputs_embeds, **VLM_EMBEDS)  # only the positions differ
        wrong = replace(pf, position_ids=other.position_ids)
    else:
        wrong = replace(pf, position_ids=reversed_visual_positions(pf))
    assert_far(generate(adapter, wrong, max_new_tokens=1)[1], logits[:, :1], atol=atol)
    # and decoding one position early (the cache length, not the prompt's next position, for a gestalt) differs
    _, early = manual_decode(adapter, pf, 5, shift=-1.0)
    assert_far(early[:, 1:logits.shape[1]], logits[:, 1:], atol=atol)


def test_generate_stops_rows_at_eos(adapter):
    imgs = [image(adapter, 3, 3), image(adapter, 4, 3, seed=1)]
    pf = prefill_for(adapter, ["What is the total?", "Date?"], adapter.encode_native(imgs))
    ref = manual_decode(adapter, pf, 6)[0].tolist()

    def cut(row, eos):  # the row's length when eos ends it
        return row.index(eos) + 1 if eos in row else len(row)

    # an end token the first row meets before the second does
    eos = next(t for t in ref[0] if cut(ref[0], t) < cut(ref[1], t))
    n0, n1 = cut(ref[0], eos), cut(ref[1], eos)
    tokens, _ = generate(adapter, pf, generation_config=GenerationConfig(max_new_tokens=6, eos_token_id=eos))
    assert tokens.tolist() == [ref[0][:n0] + [eos] * (n1 - n0), ref[1][:n1]]


def test_sampling_is_reproducible_with_a_seed_and_leaves_torchs_generator_alone(adapter):
    pf = prefill_for(adapter, ["Date?"], adapter.encode([image(adapter, 4, 4, seed=2)], [torch.tensor([[1, 2]])],
                                                        gestalt=[(2, 2)]))
    config = GenerationConfig(do_sample=True, temperature=3.0, top_k=0, max_new_tokens=8, min_new_tokens=8)
    state = torch.get_rng_state()
    a, logits = generate(adapter, pf, generation_config=config, seed=5)
    b, _ = generate(adapter, pf, generation_config=config, seed=5)
    c, _ = generate(adapter, pf, generation_config=config, seed=6)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.shape == (1, 8) and a.tolist() == b.tolist() and a.tolist() != c.tolist()
    greedy, greedy_logits = generate(adapter, pf, max_new_tokens=8)
    assert a.tolist() != greedy.tolist()  # it really sampled, from the same first distribution
    assert_close_reduction(logits[:, 0], greedy_logits[:, 0], **VLM_LOGITS)


def test_beam_search_decodes_a_batch_as_each_prompt_alone(adapter):
    imgs, questions = [image(adapter, 5, 4, seed=8), image(adapter, 3, 6, seed=9)], ["What is the total?", "Date?"]
    cells = [torch.tensor([[4, 3], [0, 0]]), torch.tensor([[2, 5], [1, 0]])]
    vis = adapter.encode(imgs, cells, gestalt=[(2, 2), (2, 2)])
    config = GenerationConfig(num_beams=2, max_new_tokens=4)
    tokens, logits = generate(adapter, prefill_for(adapter, questions, vis), generation_config=config)
    assert logits is None and tokens.shape[0] == 2 and 1 <= tokens.shape[1] <= 4
    eos = adapter.text_config.eos_token_id
    for b in range(2):
        one, _ = generate(adapter, prefill_for(adapter, [questions[b]], [vis[b]]), generation_config=config)
        n = one.shape[1]
        assert tokens[b, :n].tolist() == one[0].tolist() and set(tokens[b, n:].tolist()) <= {eos}


def test_stop_strings_end_the_answer_at_their_first_match(adapter):
    pf = prefill_for(adapter, ["Name?"], adapter.encode([image(adapter, 4, 5, seed=4)], [torch.tensor([[3, 4]])],
                                                        gestalt=[(2, 2)]))
    config = GenerationConfig(max_new_tokens=8, min_new_tokens=8)
    greedy = generate(adapter, pf, generation_config=config)[0][0].tolist()
    text = [adapter.tokenizer.decode([t]) for t in greedy]
    # a one-character token after the first that no earlier token holds (a stop string may end inside a token)
    at = next(i for i, t in enumerate(text) if i >= 1 and len(t) == 1 and t.strip() and t not in "".join(text[:i]))
    config.stop_strings = [text[at]]
    tokens = generate(adapter, pf, generation_config=config)[0][0].tolist()
    assert tokens == greedy[:at + 1] and at + 1 < len(greedy)


def test_a_streamer_prints_the_answer_as_it_is_generated(adapter):
    from transformers import TextStreamer

    class Kept(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            self.text = getattr(self, "text", "") + text

    streamer = Kept(adapter.tokenizer, skip_prompt=True, skip_special_tokens=True)
    a = ask(adapter, image(adapter, 6, 8), "Q?", arr=fast_arr(adapter.cell), saccades=4, relevance="arr",
            max_new_tokens=6, streamer=streamer)
    assert streamer.text.strip() == a.text and len(a.tokens) >= 1


def test_a_batch_of_different_sizes_equals_each_image_alone(adapter):
    imgs, questions = [image(adapter, 6, 4, seed=4), image(adapter, 3, 7, seed=5)], ["What is the total?", "Date?"]
    cells = [torch.tensor([[5, 3], [0, 0], [2, 2]]), torch.tensor([[1, 6], [2, 0], [0, 3]])]
    gestalt = [(3, 2), (2, 4)]
    vis = adapter.encode(imgs, cells, gestalt=gestalt)
    pf = prefill_for(adapter, questions, vis)
    singles = []
    for b in range(2):
        one = adapter.encode([imgs[b]], [cells[b]], gestalt=[gestalt[b]])
        assert_close_reduction(one[0].embeds, vis[b].embeds, **VLM_EMBEDS)
        singles.append(prefill_for(adapter, [questions[b]], one))
    check_batch_equals_singles(adapter, pf, singles, run_llm)


def test_native_batch_reference_is_itself_consistent(adapter):
    """The reference path pads too: a batch of two native prompts equals the two alone."""
    imgs, questions = [image(adapter, 3, 4, seed=6), image(adapter, 5, 2, seed=7)], ["a", "bbbbbb"]
    both = native_logits(adapter, imgs, questions)
    for b in range(2):
        one = native_logits(adapter, [imgs[b]], [questions[b]])
        atol = assert_close_reduction(both[b, -1], one[0, -1], **VLM_LOGITS)
    inputs = adapter.native_inputs(imgs, questions)
    short = int(inputs["attention_mask"].sum(1).argmin())
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])  # negative control: padding seen
    with torch.no_grad():
        assert_far(adapter.model(**inputs).logits[short, -1], both[short, -1], atol=atol)


# ----------------------------------------------------------------------------- errors and refusals


@pytest.mark.parametrize("kwargs, message", [
    (dict(cells=[torch.tensor([[9, 0]])]), "out of bounds for a 3x4 cell grid"),
    (dict(cells=[torch.tensor([[1, 1], [1, 1]])]), "cells must be distinct"),
    (dict(cells=[torch.zeros(3)]), "\\[K, 2\\]"),
    (dict(cells=[torch.tensor([[0, 0]])], mode="dense"), "unknown mode 'dense'"),
    (dict(cells=[torch.tensor([[0, 0]])], mode="weighted"), "weighted mode needs a \\[3, 4\\] weight map"),
    (dict(cells=[torch.tensor([[0, 0]])], layout="polar"), "unknown layout 'polar'"),
    (dict(cells=[]), "need cells, gestalt and weights for each of the 1 images"),
])
def test_encode_rejects_bad_input_clearly(adapter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        adapter.encode([image(adapter, 3, 4)], **kwargs)


@pytest.mark.parametrize("boxes, kwargs, message", [
    ([torch.tensor([[2, 3, 2]])], {}, "inside the 3x4 cell grid; \\(y, x, size\\) = \\(2, 3, 2\\) leaves it"),
    ([torch.tensor([[-1, 0, 1]])], {}, "inside the 3x4 cell grid"),
    ([torch.tensor([[0, 0, 1], [0, 0, 0]])], {}, "sizes must be >= 1; size 0 marks padding"),
    ([torch.zeros(3)], {}, "non-empty \\[K, 3\\] \\(y, x, size\\) tensor per image, got shape \\(3,\\)"),
    ([torch.zeros(0, 3)], {}, "non-empty \\[K, 3\\]"),
    ([torch.tensor([[0.5, 0.0, 1.0]])], {}, "whole cells"),
    ([torch.tensor([[0, 0, 1]])], dict(layout="polar"), "unknown layout 'polar'"),
    ([], {}, "need boxes and gestalt for each of the 1 images"),
])
def test_encode_patches_rejects_bad_boxes_clearly(adapter, boxes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        adapter.encode_patches([image(adapter, 3, 4)], boxes, **kwargs)
    # the same call with a good box encodes (only the box was wrong)
    if kwargs == {} and boxes:
        assert len(adapter.encode_patches([image(adapter, 3, 4)], [torch.tensor([[1, 2, 2]])])[0]) == 1


def fast_arr(cell):
    return ARR(ARRConfig(canvas=CanvasConfig(cell=cell), texture=TextureConfig(channels=MVP_CHANNELS)),
               query_encoder=HashingQueryEncoder()).eval()


def test_the_first_look_works_where_declared_and_is_refused_in_one_line_elsewhere(adapter):
    img = image(adapter, 6, 8)
    if FIRST_LOOK in adapter.capabilities:
        gestalt = adapter.encode_gestalt([img], [(2, 2)])
        assert len(gestalt[0]) == gestalt[0].n_gestalt == 4
        reused = adapter.encode([img], [torch.tensor([[0, 0]])], gestalt=[(2, 2)], encoded=gestalt)[0]
        fresh = adapter.encode([img], [torch.tensor([[0, 0]])], gestalt=[(2, 2)])[0]
        assert_close_reduction(reused.embeds, fresh.embeds, **VLM_EMBEDS)
        a = ask(adapter, img, "Q?", arr=fast_arr(adapter.cell), saccades=4, relevance="vlm", max_new_tokens=1)
        assert (a.relevance, a.gestalt_tokens, a.saccades) == ("vlm", 4, 4)
        return
    message = f"needs an adapter that encodes the gestalt alone and reuses it .*; {adapter.name} does not: use qwen"
    with pytest.raises(ValueError, match=message):
        adapter.encode_gestalt([img], [(2, 2)])
    with pytest.raises(ValueError, match="relevance 'vlm' " + message):
        ask(adapter, img, "Q?", arr=fast_arr(adapter.cell), saccades=4, relevance="vlm")
    fresh = adapter.encode([img], [torch.tensor([[0, 0]])], gestalt=[(2, 2)])
    with pytest.raises(ValueError, match="reusing an encoded gestalt " + message):
        adapter.encode([img], [torch.tensor([[0, 0]])], gestalt=[(2, 2)], encoded=fresh)


def test_the_processor_view_works_where_declared_and_is_refused_in_one_line_elsewhere(adapter):
    photo = Image.fromarray((image(adapter, 4, 6) * 255).byte().permute(1, 2, 0).numpy())
    native = Plan("native", "native", (4, 6), native=6)
    if PROCESSOR in adapter.capabilities:
        vis = encode(adapter, [native], [image(adapter, 4, 6)], sources=[photo])[0]
        assert 1 <= len(vis) <= 6 and vis.n_gestalt == 0
        assert len(encode(adapter, [replace(native, native=24)], [image(adapter, 4, 6)], sources=[photo])[0]) == 24
        return
    with pytest.raises(ValueError, match=f"a native plan needs an adapter that encodes through the model's own "
                                         f"image processor .*; {adapter.name} does not"):
        encode(adapter, [native], [image(adapter, 4, 6)], sources=[photo])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_is_used_where_declared_and_refused_in_one_line_elsewhere(adapter, layout):
    img, cells = image(adapter, 4, 4), torch.tensor([[3, 0], [1, 2]])
    plan = Plan("arr", "cells", (4, 4), gestalt=(2, 2), cells=cells)
    if layout in adapter.layouts:
        vis = encode(adapter, [plan], [img], layout=layout)[0]
        assert (vis.n_gestalt, len(vis)) == (adapter.encode([img], [cells], gestalt=[(2, 2)])[0].n_gestalt,
                                             vis.n_gestalt + 2)
        return
    message = f"{adapter.name} has one saccade layout \\(scaled\\).*layout '{layout}' needs an M-RoPE family"
    with pytest.raises(ValueError, match=message):
        encode(adapter, [plan], [img], layout=layout)
    with pytest.raises(ValueError, match=message):
        ask(adapter, img, "Q?", arr=fast_arr(adapter.cell), saccades=2, layout=layout, relevance="arr")
