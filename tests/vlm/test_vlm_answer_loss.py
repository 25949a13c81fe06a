"""The answer cross-entropy through a frozen VLM, on tiny random-weight Qwen-VL and LLaVA models.

Each exactness test carries a negative control (shifted labels, scaled deepstack), so a test cannot
pass because the loss ignores what it is checked for.
"""
import pytest
import torch
from tolerances import VLM_LOSS, VLM_LOSS_GRAD, assert_close_reduction, assert_far, reduction_atol

from arr_coc.engine.soft_topk import soft_topk
from arr_coc.vlm import ADAPTERS, assemble
from arr_coc.vlm.answer_loss import answer_ids, answer_loss, eos_token_id
from arr_coc.vlm.tiny import tiny_image_processor, tiny_llava_model, tiny_llava_tokenizer, tiny_model, tiny_tokenizer

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "llava")


def frozen_adapter(family):
    if family == "llava":
        return ADAPTERS.get("llava")(tiny_llava_model().requires_grad_(False), tiny_llava_tokenizer())
    ip = tiny_image_processor(family)
    return ADAPTERS.get(family)(tiny_model(family).requires_grad_(False), tiny_tokenizer(),
                                image_mean=ip.image_mean, image_std=ip.image_std)


@pytest.fixture(scope="module", params=FAMILIES)
def adapter(request):
    return frozen_adapter(request.param)


@pytest.fixture(scope="module")
def qwen25():
    return frozen_adapter("qwen2_5_vl")


def image(adapter, hc, wc, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=g)


def cross_entropy(logits, targets, shift=0):
    """Mean -log p of ``targets`` [T] under the logits [L, V] of a sequence ending in them, by hand.

    Position j predicts token j + 1, so the targets read the T logits before the last one;
    ``shift`` reads them that many positions earlier (the negative control).
    """
    t = len(targets)
    logp = torch.log_softmax(logits[-t - 1 - shift:logits.shape[0] - 1 - shift].double(), -1)  # [T, V]
    return -logp.gather(1, torch.tensor(targets)[:, None]).mean().item()


def native_with_answer(adapter, img, question, targets):
    """The model's own inputs for one image and question with the answer ids appended (teacher forcing)."""
    x = adapter.native_inputs([img], [question])
    ids = torch.tensor([targets])
    x["input_ids"] = torch.cat([x["input_ids"], ids], 1)
    x["attention_mask"] = torch.cat([x["attention_mask"], torch.ones_like(ids)], 1)
    if "mm_token_type_ids" in x:  # Qwen: answer tokens are text
        x["mm_token_type_ids"] = torch.cat([x["mm_token_type_ids"], torch.zeros_like(ids, dtype=torch.int)], 1)
    if "position_ids" in x:  # LLaVA: one unpadded row counts 0, 1, ...
        x["position_ids"] = torch.arange(x["input_ids"].shape[1])[None]
    return x


def weighted_reference(adapter, img, question, targets, weight, scale_deepstack=False):
    """Cross-entropy by hand of what ``encode(mode="weighted")`` sends the LLM, answer appended."""
    with torch.no_grad():
        vis = adapter.encode([img], [None], mode="weighted", weights=[weight])
        if scale_deepstack:
            vis[0].deepstack = [d * weight.reshape(-1, 1) for d in vis[0].deepstack]
        return reference_loss(adapter, vis, question, targets)


def reference_loss(adapter, vis, question, targets):
    """Cross-entropy by hand of the answer ``targets`` after one image's visual tokens and ``question``."""
    with torch.no_grad():
        pre, suf = adapter.prompt_ids(question)
        pf = assemble(adapter.embed_tokens, [pre], vis, [suf + targets], adapter.rope_rows)
        hidden = adapter.language_model(dict(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask,
                                             position_ids=pf.position_ids, visual_mask=pf.visual_mask,
                                             deepstack=pf.deepstack))
        return cross_entropy(adapter.logits(hidden)[0], targets)


# ----------------------------------------------------------------------------- exactness


def test_answer_ids_end_with_the_models_eos(adapter):
    ids = answer_ids(adapter, "42")
    assert eos_token_id(adapter) == adapter.text_config.eos_token_id == 2
    assert ids == adapter.tokenizer("42", add_special_tokens=False)["input_ids"] + [2] and len(ids) == 3


def test_all_ones_equals_the_cross_entropy_of_the_native_forward(adapter):
    # LLaVA's own view is one S x S tile: a 4 x 4 cell image is exactly that view at full resolution
    img = image(adapter, 4, 4) if adapter.name == "llava" else image(adapter, 3, 5)
    q, answer = "What is the total?", "12.50 USD"
    targets = answer_ids(adapter, answer)
    with torch.no_grad():
        logits = adapter.model(**native_with_answer(adapter, img, q, targets)).logits[0]  # [L, V]
        loss = answer_loss(adapter, [img], [q], [answer], [torch.ones(img.shape[1] // adapter.cell,
                                                                         img.shape[2] // adapter.cell)])
    assert loss.shape == () and 1.0 < loss.item() < 20.0
    atol = assert_close_reduction(loss.item(), cross_entropy(logits, targets), **VLM_LOSS)
    # negative control: the same logits scored against labels one position off
    assert_far(loss.item(), cross_entropy(logits, targets, shift=1), atol=atol)


def test_weights_scale_the_tokens_exactly_as_weighted_mode_does(adapter):
    img, q, answer = image(adapter, 3, 4, seed=1), "Date?", "2024"
    weight = torch.rand(3, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        loss = answer_loss(adapter, [img], [q], [answer], [weight]).item()
    targets = answer_ids(adapter, answer)
    atol = assert_close_reduction(loss, weighted_reference(adapter, img, q, targets, weight), **VLM_LOSS)
    assert_far(loss, weighted_reference(adapter, img, q, targets, torch.ones(3, 4)), atol=atol)
    if adapter.name == "qwen3_vl":  # the deepstack features pass unscaled, and that is a real choice
        assert_far(loss, weighted_reference(adapter, img, q, targets, weight, scale_deepstack=True), atol=atol)


def test_a_batch_of_two_sizes_equals_each_example_alone(adapter):
    imgs = [image(adapter, 5, 3, seed=3), image(adapter, 2, 6, seed=4)]
    questions, answers = ["What is the total amount?", "Who?"], ["7", "Alice Smith"]  # padded both ways
    weights = [torch.rand(5, 3, generator=torch.Generator().manual_seed(5)), torch.full((2, 6), 0.7)]
    with torch.no_grad():
        both = answer_loss(adapter, imgs, questions, answers, weights, reduction="none")
        mean = answer_loss(adapter, imgs, questions, answers, weights)
        alone = [answer_loss(adapter, [imgs[b]], [questions[b]], [answers[b]], [weights[b]]) for b in range(2)]
    atol = assert_close_reduction(both, torch.stack(alone), **VLM_LOSS)
    assert both.shape == (2,)
    assert_far(both[0], both[1], atol=atol)  # the two examples' losses differ: the comparison can fail
    assert_close_reduction(mean, both.mean(), reduction_len=2)  # the same batch; the mean of two


# ----------------------------------------------------------------------------- gradients


def test_the_gradient_reaches_the_weights_and_never_the_vlm(adapter):
    img, q, answer = image(adapter, 3, 3, seed=6), "What is the total?", "42"
    base = 0.5 + 0.3 * torch.rand(3, 3, generator=torch.Generator().manual_seed(7))
    weight = base.clone().requires_grad_(True)
    answer_loss(adapter, [img], [q], [answer], [weight]).backward()
    grad = weight.grad
    assert torch.isfinite(grad).all() and (grad != 0).all()
    assert all(p.grad is None for p in adapter.model.parameters()) and not adapter.model.training
    # central finite difference on the cell the loss is most sensitive to
    y, x = divmod(int(grad.abs().argmax()), 3)
    eps, step = 1e-2, torch.zeros(3, 3)
    step[y, x] = eps
    with torch.no_grad():
        up, down = (answer_loss(adapter, [img], [q], [answer], [base + s]).item() for s in (step, -step))
    numeric = (up - down) / (2 * eps)
    assert abs(numeric - grad[y, x].item()) <= 1e-2 * abs(grad[y, x].item())


def test_optimizing_a_soft_topk_relevance_map_lowers_the_loss(qwen25):
    torch.manual_seed(0)
    img, q, answer = image(qwen25, 4, 4), "What is the total?", "42"
    relevance = torch.nn.Parameter(torch.zeros(4, 4))  # every cell equally relevant at first
    opt = torch.optim.Adam([relevance], lr=0.5)
    losses = []
    for _ in range(40):
        weights = soft_topk(relevance.flatten()[None], 4, temperature=0.2).view(4, 4)  # four cells' worth
        loss = answer_loss(qwen25, [img], [q], [answer], [weights])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses
    assert all(p.grad is None for p in qwen25.model.parameters())


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("change, message", [
    (dict(answers=[""]), "answers must be non-empty text, got ''"),
    (dict(answers=["  "]), "answers must be non-empty text"),
    (dict(weights=[torch.ones(3, 2)]), "weights 0 must be a float \\[2, 3\\] map"),
    (dict(weights=[torch.ones(6)]), "weights 0 must be a float \\[2, 3\\] map"),
    (dict(weights=[torch.ones(2, 3, dtype=torch.long)]), "must be a float"),
    (dict(answers=["a", "b"]), "need one question, answer and weight map per image, got 1 images, 1 questions, "
                               "2 answers"),
    (dict(questions=[]), "need one question, answer and weight map per image"),
    (dict(images=[torch.rand(3, 30, 56)]), "image 0 must be \\[3, H, W\\] with sides multiples of the 28 px"),
    (dict(reduction="sum"), "unknown reduction 'sum'"),
])
def test_answer_loss_rejects_bad_input_clearly(qwen25, change, message):
    args = dict(images=[image(qwen25, 2, 3)], questions=["?"], answers=["yes"], weights=[torch.ones(2, 3)])
    reduction = change.pop("reduction", "mean")
    args.update(change)
    with pytest.raises(ValueError, match=message):
        answer_loss(qwen25, **args, reduction=reduction)


def test_a_vlm_that_is_not_frozen_is_refused():
    ip = tiny_image_processor("qwen2_5_vl")
    adapter = ADAPTERS.get("qwen2_5_vl")(tiny_model("qwen2_5_vl"), tiny_tokenizer(), image_mean=ip.image_mean,
                                         image_std=ip.image_std)
    args = ([image(adapter, 2, 2)], ["?"], ["yes"], [torch.ones(2, 2)])
    with pytest.raises(ValueError, match="requires_grad_\\(False\\)"):
        answer_loss(adapter, *args)
    adapter.model.requires_grad_(False).train()
    with pytest.raises(ValueError, match="training mode; call adapter.model.eval\\(\\)"):
        answer_loss(adapter, *args)
    adapter.model.eval()
    assert answer_loss(adapter, *args).item() > 0


# ----------------------------------------------------------------------------- memory: activation checkpointing


def loss_and_grad(adapter, checkpointing, weight_seed=8, **kw):
    """Answer loss at a soft top-K map of a learnable relevance, its gradient, and what the forward kept."""
    img, q, answer = image(adapter, 4, 4, seed=9), "What is the total?", "12.50"
    relevance = torch.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(weight_seed)))
    weights = soft_topk(relevance.flatten()[None], 5, temperature=0.5).view(4, 4)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        loss = answer_loss(adapter, [img], [q], [answer], [weights], checkpointing=checkpointing, **kw)
    loss.backward()
    return loss.item(), relevance.grad, sum(kept)


@pytest.mark.parametrize("kw", [{}, {"gestalt": [(2, 2)]}], ids=["weighted", "with-gestalt"])
def test_checkpointing_gives_the_same_loss_and_gradient_in_less_memory(adapter, kw):
    loss, grad, kept = loss_and_grad(adapter, False, **kw)
    loss_ck, grad_ck, kept_ck = loss_and_grad(adapter, True, **kw)
    assert_close_reduction(loss_ck, loss, **VLM_LOSS)
    atol = assert_close_reduction(grad_ck, grad, **VLM_LOSS_GRAD)
    assert kept_ck < 0.5 * kept  # the decoder layers' activations were not kept: recomputed in backward
    # negative control: another relevance gives another gradient at this tolerance
    assert_far(loss_and_grad(adapter, True, weight_seed=10, **kw)[1], grad, atol=atol)
    # the model is left as it was: eval mode everywhere, no parameter gradient
    assert not any(m.training for m in adapter.model.modules())
    assert all(p.grad is None for p in adapter.model.parameters())


def test_checkpointing_needs_transformers_layers():
    from arr_coc.vlm.answer_loss import activation_checkpointing

    with pytest.raises(ValueError, match="Linear has no transformers layers to checkpoint"):
        with activation_checkpointing(torch.nn.Linear(2, 2)):
            pass


# ----------------------------------------------------------------------------- relaxations against inference


def sparse_reference(adapter, img, question, targets, cells):
    """Cross-entropy by hand of the exact inference path: only ``cells`` encoded (sparse), weight one."""
    with torch.no_grad():
        return reference_loss(adapter, adapter.encode([img], [cells], mode="sparse"), question, targets)


def test_relaxation_gaps_are_each_relaxation_minus_the_exact_sparse_path(qwen25):
    from arr_coc.vlm.answer_loss import relaxation_gap, top_cells

    imgs = [image(qwen25, 4, 5, seed=11), image(qwen25, 3, 4, seed=12)]
    qs, answers = ["What is the total?", "Date?"], ["12.50", "2024"]
    rel = [torch.randn(4, 5, generator=torch.Generator().manual_seed(13)),
           torch.randn(3, 4, generator=torch.Generator().manual_seed(14))]
    ks = [4, 3]
    out = relaxation_gap(qwen25, imgs, qs, answers, rel, ks, temperature=0.5)
    for b in range(2):
        cells = top_cells(rel[b], ks[b])
        assert cells.tolist() == sorted(cells.tolist(), key=lambda c: -rel[b][c[0], c[1]].item())
        ref = sparse_reference(qwen25, imgs[b], qs[b], answer_ids(qwen25, answers[b]), cells)
        atol = assert_close_reduction(out["exact"][b].item(), ref, **VLM_LOSS)
        # negative control: the top K + 1 cells are another input
        wider = sparse_reference(qwen25, imgs[b], qs[b], answer_ids(qwen25, answers[b]), top_cells(rel[b], ks[b] + 1))
        assert_far(out["exact"][b].item(), wider, atol=atol)
    assert torch.equal(out["gap_weighted"], out["weighted"] - out["exact"])  # the gap is this subtraction
    assert torch.equal(out["gap_candidates"], out["candidates"] - out["exact"])
    atol = reduction_atol(out["exact"], **VLM_LOSS)
    for gap in (out["gap_candidates"], out["gap_weighted"]):  # each relaxation really differs from inference
        assert_far(gap.abs().min(), 0.0, atol=atol)
    # K candidates at hard (straight-through) weights are the inference path itself: no gap
    hard = relaxation_gap(qwen25, imgs, qs, answers, rel, ks, candidates=1, straight_through=True)
    assert_close_reduction(hard["candidates"], hard["exact"], **VLM_LOSS)
    assert_far(hard["gap_weighted"].abs().min(), 0.0, atol=atol)
