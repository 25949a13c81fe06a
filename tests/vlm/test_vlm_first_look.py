"""The VLM's first look against transformers' own attention weights, and the second pass against one prefill.

Tiny random-weight models of each Qwen-VL family (matrices redrawn, ``arr_coc.vlm.tiny``). The first
look runs under the models' default SDPA attention; the reference is the same weights under eager
attention with ``output_attentions=True``. Every equality has a negative control.
"""
import pytest
import torch
from tolerances import VLM_ATTENTION, VLM_EMBEDS, VLM_LM, VLM_LOGITS, assert_close_reduction, assert_far, reduction_atol

from arr_coc.vlm import ADAPTERS, assemble, generate
from arr_coc.vlm.first_look import first_look, question_attention, second_pass_prefill
from arr_coc.vlm.stages import decode, prefill
from arr_coc.vlm.tiny import FAMILIES, tiny_image_processor, tiny_model, tiny_tokenizer


def make(family, attn=None):
    model = tiny_model(family)
    if attn is not None:
        model.set_attn_implementation(attn)
    ip = tiny_image_processor(family)
    return ADAPTERS.get(family)(model, tiny_tokenizer(), image_mean=ip.image_mean, image_std=ip.image_std)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    """The same tiny model twice: as built (SDPA) and under eager attention (the reference)."""
    return make(request.param), make(request.param, "eager")


def image(adapter, hc, wc, seed=0):
    return torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=torch.Generator().manual_seed(seed))


def eager_attentions(adapter, prefixes, visuals, suffixes):
    pf = assemble(adapter.embed_tokens, prefixes, visuals, suffixes, adapter.rope_rows)
    x = dict(visual_mask=pf.visual_mask, deepstack=pf.deepstack)
    with torch.no_grad():
        out = adapter.lm(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask,
                         position_ids=pf.position_ids, output_attentions=True, **adapter.deepstack_kwargs(x))
    return out.attentions, pf


IMAGES = [((6, 4), (3, 2), "What is the total?"), ((3, 7), (2, 4), "Date?")]


def test_first_look_equals_eager_output_attentions(pair):
    fast, eager = pair
    assert fast.model.config.text_config._attn_implementation != "eager"
    imgs = [image(fast, *hw, seed=i) for i, (hw, _, _) in enumerate(IMAGES)]
    grids = [g for _, g, _ in IMAGES]
    questions = [q for _, _, q in IMAGES]
    gestalt = fast.encode_gestalt(imgs, grids)
    look = first_look(fast, gestalt, grids, questions, layers=(0, 1))  # a batch of two prompt lengths
    assert look.layers == (0, 1) and look.cache.get_seq_length() == look.attention_mask.shape[1]
    for b in range(2):
        pre, suf = fast.prompt_ids(questions[b])
        atts, pf = eager_attentions(eager, [pre], [gestalt[b]], [suf])  # each prompt alone, no padding
        length, n_g, n_q = pf.inputs_embeds.shape[1], len(gestalt[b]), len(suf)
        got = look.attention[b]  # [layers, H, Q, G]
        assert got.shape == (2, 2, n_q, n_g)
        for layer in (0, 1):
            ref = atts[layer][0, :, length - n_q:, length - n_q - n_g:length - n_q]
            atol = assert_close_reduction(got[layer], ref, **VLM_ATTENTION)
            assert ref.sum() > 0.05 * n_q  # the gestalt really draws attention
        # negative control: the other layer's weights differ
        assert_far(got[0], atts[1][0, :, length - n_q:, length - n_q - n_g:length - n_q], atol=atol)
        m = look.maps()[b]
        assert m.shape == grids[b] and torch.equal(m.flatten(), got.mean((0, 1, 2)))  # maps() is this mean


def test_recomputed_attention_needs_the_true_positions(pair):
    fast, eager = pair
    img, grid, q = image(fast, 4, 4, seed=3), (2, 2), "Where?"
    gestalt = fast.encode_gestalt([img], [grid])
    pre, suf = fast.prompt_ids(q)
    atts, pf = eager_attentions(eager, [pre], gestalt, [suf])
    hidden = []
    with torch.no_grad():
        handle = eager.lm.layers[1].register_forward_pre_hook(lambda m, a: hidden.append(a[0]))
        eager.language_model(dict(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask,
                                  position_ids=pf.position_ids, visual_mask=pf.visual_mask, deepstack=pf.deepstack))
        handle.remove()
        n_q = len(suf)
        right = question_attention(eager, 1, hidden[0], pf.position_ids, pf.attention_mask, n_q)
        atol = assert_close_reduction(right, atts[1][:, :, -n_q:], **VLM_ATTENTION)
        shifted = pf.position_ids.clone()
        shifted[:, :, -n_q:] += 1  # the question one step further from the image
        wrong = question_attention(eager, 1, hidden[0], shifted, pf.attention_mask, n_q)
        assert_far(wrong, right, atol=atol)
        swapped = pf.position_ids.clone()  # h and w of the gestalt swapped
        swapped[1:, :, pf.visual_mask[0]] = swapped[[2, 1]][:, :, pf.visual_mask[0]]
        assert_far(question_attention(eager, 1, hidden[0], swapped, pf.attention_mask, n_q), right, atol=atol)


def test_cell_maps_spread_the_gestalt_over_the_image_cells(pair):
    fast, _ = pair
    img = image(fast, 6, 6, seed=5)
    look = first_look(fast, fast.encode_gestalt([img], [(2, 2)]), [(2, 2)], ["Total?"], layers=(1,))
    m = look.maps()[0]
    assert m.shape == (2, 2) and (m > 0).all()
    cells, same = look.cell_maps([(6, 6), (2, 2)][:1])[0], look.cell_maps([(2, 2)])[0]
    assert torch.equal(same, m / m.max())  # a grid the size of the gestalt is the map itself (weights 1 and 0)
    # gestalt token (i, j) stands for the 3x3 cells around cell (3i + 1, 3j + 1): there the map is the token's
    assert cells.shape == (6, 6) and cells.max().item() == pytest.approx(1.0)
    # bilinear: 4 terms, then the division; the 1/3 scale is rounded, so the weights are 1 and 0 only to eps
    atol = assert_close_reduction(cells[1::3, 1::3], m / m.max(), reduction_len=4, depth=2)
    # negative control: reading the map transposed misplaces it
    assert_far(cells[1::3, 1::3], (m / m.max()).T, atol=atol)


# ----------------------------------------------------------------------------- second pass


def two_pass_setup(adapter, hws, grids, cells, questions, layout="scaled", seeds=None):
    imgs = [image(adapter, *hw, seed=s) for hw, s in zip(hws, seeds or range(10, 10 + len(hws)))]
    gestalt = adapter.encode_gestalt(imgs, grids)
    look = first_look(adapter, gestalt, grids, questions, layers=(1,))
    visuals = adapter.encode(imgs, cells, gestalt=grids, layout=layout, encoded=gestalt)
    return imgs, gestalt, look, visuals


def second_pass(adapter, look, visuals, max_new_tokens):
    """The answer stages on top of a first look: the prefill continues its cache, then greedy decoding."""
    return decode(adapter, prefill(adapter, visuals, [], first_look=look), max_new_tokens=max_new_tokens)


def test_second_pass_equals_one_fresh_prefill_of_the_same_sequence(pair):
    fast, _ = pair
    hws, grids, qs = [(6, 5)], [(3, 3)], ["What is the date?"]
    cells = [torch.tensor([[5, 4], [1, 1], [3, 0], [0, 4]])]
    imgs, gestalt, look, visuals = two_pass_setup(fast, hws, grids, cells, qs)
    # the reused gestalt is what encode gives with the saccades
    fresh = fast.encode(imgs, cells, gestalt=grids)
    assert_close_reduction(visuals[0].embeds, fresh[0].embeds, **VLM_EMBEDS)
    assert visuals[0].positions.tolist() == fresh[0].positions.tolist()
    pre, suf = fast.prompt_ids(qs[0])
    single = assemble(fast.embed_tokens, [pre], visuals, [suf], fast.rope_rows)
    ref_tokens, ref_logits = generate(fast, single, max_new_tokens=4)
    tokens, logits = second_pass(fast, look, visuals, max_new_tokens=4)
    assert tokens.tolist() == ref_tokens.tolist()
    atol = assert_close_reduction(logits, ref_logits, **VLM_LM)  # the same visual tokens on both sides
    # negative control: the question's keys left in the cache (the first look not cut back)
    _, _, look2, visuals2 = two_pass_setup(fast, hws, grids, cells, qs)
    n_q = len(suf)
    pf = second_pass_prefill(fast, look2, visuals2)
    extra = look2.attention_mask.new_ones(1, n_q)
    with torch.no_grad():
        fast.language_model(dict(inputs_embeds=fast.embed_tokens(torch.tensor([suf])), attention_mask=torch.cat(
            [look2.attention_mask, extra], 1), position_ids=pf.position_ids[:, :, -n_q:], past_key_values=look2.cache))
    _, stale = generate(fast, pf, max_new_tokens=1, cache=look2.cache,
                        past_mask=torch.cat([look2.attention_mask, extra], 1))
    assert_far(stale[:, 0], ref_logits[:, 0], atol=atol)


def test_second_pass_positions_matter(pair):
    fast, _ = pair
    cells = [torch.tensor([[0, 0], [2, 3], [4, 1]])]
    _, _, look, visuals = two_pass_setup(fast, [(5, 4)], [(2, 2)], cells, ["Name?"])
    pre, suf = fast.prompt_ids("Name?")
    _, ref = generate(fast, assemble(fast.embed_tokens, [pre], visuals, [suf], fast.rope_rows), max_new_tokens=1)
    pf = second_pass_prefill(fast, look, visuals)
    pf.position_ids[1:, :, pf.visual_mask[0]] += 0.5  # saccades half a cell off
    _, wrong = generate(fast, pf, max_new_tokens=1, cache=look.cache, past_mask=look.attention_mask)
    assert_far(wrong, ref, atol=reduction_atol(ref, **VLM_LM))  # the same visual tokens on both sides


def test_a_batch_through_both_passes_equals_each_image_alone(pair):
    fast, _ = pair
    hws, grids = [(6, 4), (3, 7)], [(3, 2), (2, 4)]
    qs = ["What is the total?", "Date?"]
    cells = [torch.tensor([[5, 3], [0, 0], [2, 2]]), torch.tensor([[1, 6], [2, 0]])]
    _, _, look, visuals = two_pass_setup(fast, hws, grids, cells, qs, layout="temporal")
    tokens, logits = second_pass(fast, look, visuals, max_new_tokens=3)
    for b in range(2):
        _, _, one, vis = two_pass_setup(fast, [hws[b]], [grids[b]], [cells[b]], [qs[b]], layout="temporal",
                                          seeds=[10 + b])
        assert_close_reduction(one.attention[0], look.attention[b], **VLM_ATTENTION)
        t1, l1 = second_pass(fast, one, vis, max_new_tokens=3)
        assert t1.tolist() == tokens[b:b + 1].tolist()
        assert_close_reduction(l1, logits[b:b + 1], **VLM_LOGITS)


def test_first_look_refuses_what_it_cannot_read(pair):
    fast, _ = pair
    img = image(fast, 4, 4)
    gestalt = fast.encode_gestalt([img], [(2, 2)])
    with pytest.raises(ValueError, match="layers must be decoder layers 0..1, got \\[2\\]"):
        first_look(fast, gestalt, [(2, 2)], ["?"], layers=(2,))
    full = fast.encode([img], [torch.tensor([[0, 0]])], gestalt=[(2, 2)])
    with pytest.raises(ValueError, match="gestalt tokens only, 2x2 = 4 per image; got 5 tokens"):
        first_look(fast, full, [(2, 2)], ["?"])
    look = first_look(fast, gestalt, [(2, 2)], ["?"])
    other = fast.encode([img], [torch.tensor([[0, 0]])], gestalt=[(1, 1)])
    with pytest.raises(ValueError, match="not the one the first look prefilled"):
        second_pass_prefill(fast, look, other)


@pytest.mark.parametrize("config", [dict(num_beams=2, max_new_tokens=4),
                                    dict(do_sample=True, temperature=2.0, top_k=0, max_new_tokens=4)])
def test_the_first_looks_cache_decodes_beams_and_samples_as_one_fresh_pass(pair, config):
    from transformers import GenerationConfig

    fast, _ = pair
    qs = ["What is the total?", "Date?"]
    cells = [torch.tensor([[5, 3], [0, 0], [2, 2]]), torch.tensor([[1, 6], [2, 0]])]
    _, _, look, visuals = two_pass_setup(fast, [(6, 4), (3, 7)], [(3, 2), (2, 4)], cells, qs)
    prompts = [fast.prompt_ids(q) for q in qs]
    fresh = assemble(fast.embed_tokens, [p[0] for p in prompts], visuals, [p[1] for p in prompts], fast.rope_rows)
    gc = GenerationConfig(**config)
    ref, _ = generate(fast, fresh, generation_config=gc, seed=1)
    tokens, _ = decode(fast, prefill(fast, visuals, [], first_look=look), generation_config=gc, seed=1)
    assert tokens.shape[0] == 2 and tokens.tolist() == ref.tolist()
    # negative control: another seed draws other samples (beams do not draw)
    if config.get("do_sample"):
        _, _, look, visuals = two_pass_setup(fast, [(6, 4), (3, 7)], [(3, 2), (2, 4)], cells, qs)
        other, _ = decode(fast, prefill(fast, visuals, [], first_look=look), generation_config=gc, seed=2)
        assert other.tolist() != tokens.tolist()
