"""What the sparse path costs: the first look stops at the last decoder layer it reads, and at equal tokens the
sparse path's tower + prefill FLOPs are native_budget's (tiny random Qwen2.5-VL; the 3B config on the meta device)."""
import pytest
import torch
from tolerances import VLM_LM, assert_close_reduction

from arr_coc.engine.plan import Plan
from arr_coc.vlm import ADAPTERS, assemble, encode, generate, prefill
from arr_coc.vlm.cost import prefill_flops
from arr_coc.vlm.first_look import first_look
from arr_coc.vlm.stages import decode
from arr_coc.vlm.tiny import tiny_image_processor, tiny_model, tiny_tokenizer


def adapter_of(layers=2):
    ip = tiny_image_processor("qwen2_5_vl")
    return ADAPTERS.get("qwen2_5_vl")(tiny_model("qwen2_5_vl", layers=layers), tiny_tokenizer(),
                                       image_mean=ip.image_mean, image_std=ip.image_std)


@pytest.fixture(scope="module")
def deep():
    return adapter_of(layers=4)


def image(adapter, hc, wc, seed=0):
    return torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=torch.Generator().manual_seed(seed))


class LayerCalls:
    """How many times each decoder layer ran (forward hooks)."""

    def __init__(self, layers):
        self.calls = [0] * len(layers)
        self.handles = [layer.register_forward_hook(self._count(i)) for i, layer in enumerate(layers)]

    def _count(self, i):
        def count(*_):
            self.calls[i] += 1
        return count

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------- the first look stops early


def test_the_question_pass_stops_at_the_last_layer_read(deep):
    img, grid = image(deep, 6, 4), (3, 2)
    gestalt = deep.encode_gestalt([img], [grid])
    with torch.no_grad(), LayerCalls(deep.lm.layers) as seen:
        look = first_look(deep, gestalt, [grid], ["What is the total?"], layers=(0, 1))
    # prefix + gestalt run through all 4 layers (the answer continues that cache); the question through 0 and 1
    assert seen.calls == [2, 2, 1, 1]
    assert [layer.get_seq_length() for layer in look.cache.layers] == [look.attention_mask.shape[1]] * 4
    with torch.no_grad(), LayerCalls(deep.lm.layers) as top:  # control: reading the top layer runs every layer
        first_look(deep, gestalt, [grid], ["What is the total?"], layers=(3,))
    assert top.calls == [2, 2, 2, 2]


def test_a_stopped_first_look_answers_as_one_fresh_prefill(deep):
    img, grid, q = image(deep, 6, 5, seed=3), (3, 3), "What is the date?"
    cells = [torch.tensor([[5, 4], [1, 1], [3, 0], [0, 4]])]
    gestalt = deep.encode_gestalt([img], [grid])
    with torch.no_grad():
        look = first_look(deep, gestalt, [grid], [q], layers=(1,))  # stops before layers 2 and 3
        visuals = deep.encode([img], cells, gestalt=[grid], encoded=gestalt)
        pre, suf = deep.prompt_ids(q)
        ref_tokens, ref_logits = generate(deep, assemble(deep.embed_tokens, [pre], visuals, [suf], deep.rope_rows),
                                          max_new_tokens=4)
        tokens, logits = decode(deep, prefill(deep, visuals, [], first_look=look), max_new_tokens=4)
    assert tokens.tolist() == ref_tokens.tolist()
    assert_close_reduction(logits, ref_logits, **VLM_LM)


# ----------------------------------------------------------------------------- equal tokens, equal FLOPs


def test_sparse_and_native_budget_cost_the_same_weight_flops_at_equal_tokens():
    """Gestalt 2x2 + K = 12 saccades = 16 tokens; native_budget downscales the 10x10-cell page to 4x4 = 16 tokens."""
    a = adapter_of()
    img, grid, gestalt, k = image(a, 10, 10, seed=1), (10, 10), (2, 2), 12
    cells = torch.tensor([[i // 4, 2 * (i % 4)] for i in range(k)])  # distinct cells
    sparse, native = encode(a, [Plan("arr", "cells", grid, gestalt=gestalt, cells=cells),
                                Plan("native_budget", "native", grid, native=16)], [img, img])
    assert len(sparse) == len(native) == 16  # equal tokens
    assert sparse.vision_segments == (16, 48) and native.vision_segments == (64,)  # patches: 4 per token
    pre, suf = a.prompt_ids("What is the total?")
    prompts = [prefill(a, [v], [(pre, suf)]).prefill.inputs_embeds.shape[1] for v in (sparse, native)]
    assert prompts[0] == prompts[1] == len(pre) + 16 + len(suf)  # the same prompt length
    f_sparse, f_native = (prefill_flops(a, n, v.vision_segments) for n, v in zip(prompts, (sparse, native)))
    assert f_sparse["llm"] == f_native["llm"]  # the same prefill
    # the tower: the same weights on the same 64 patches; windowed layers attend within 16-patch windows either way;
    # only the full-attention layer differs: gestalt and saccades are two segments (16^2 + 48^2 pairs, not 64^2)
    cfg = a.model.config.vision_config
    full_layers, width = len(cfg.fullatt_block_indexes), cfg.hidden_size
    assert f_native["vision"] - f_sparse["vision"] == 4 * width * full_layers * (64 ** 2 - 16 ** 2 - 48 ** 2)
    # control: one saccade more is more work in both the tower and the prefill
    more = encode(a, [Plan("arr", "cells", grid, gestalt=gestalt, cells=torch.cat([cells, torch.tensor([[9, 9]])]))], [img])[0]
    f_more = prefill_flops(a, prompts[0] + 1, more.vision_segments)
    assert f_more["llm"] > f_native["llm"] and f_more["vision"] > f_sparse["vision"]


def test_on_the_3b_config_the_two_segments_save_under_one_percent():
    """Qwen2.5-VL-3B at 1344 px (gestalt 16x16 + 273 = 529 = 23x23 tokens): the segments' saving in the tower's 4
    full-attention layers is the only difference, and it is small next to the whole."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from arr_coc.vlm.qwen import Qwen25VLAdapter

    text = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                num_attention_heads=16, num_key_value_heads=2,
                rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[16, 24, 24]))
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                  window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
    with torch.device("meta"):
        a = Qwen25VLAdapter(Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text,
                                                                                vision_config=vision)))
    prompt = 30 + 529
    sparse, native = prefill_flops(a, prompt, (1024, 1092)), prefill_flops(a, prompt, (2116,))
    assert sparse["llm"] == native["llm"]
    saving = 4 * 1280 * 4 * (2116 ** 2 - 1024 ** 2 - 1092 ** 2)  # 4 full-attention layers, width 1280
    assert native["total"] - sparse["total"] == saving
    assert 0.007 < saving / native["total"] < 0.01  # 0.8 %: the estimate says equal work within 1 %
