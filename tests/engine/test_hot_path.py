"""The allocation's hot path: a batch of B pages in one ARR pass gives each page's single-pass allocation, and on a
GPU selection + extraction read back to the host once (the budget check).

The host reads cannot be seen on the CPU: the test that counts them runs only where CUDA exists
(``torch.cuda.set_sync_debug_mode``); on the CPU it is skipped.
"""
import warnings

import pytest
import torch
from tolerances import ARR_MAP, CANVAS, assert_close_reduction

from arr_coc.config import ARRConfig, SamplerConfig, TextureConfig
from arr_coc.engine.extract import extract_gather, extract_loop
from arr_coc.engine.imageio import load_image
from arr_coc.engine.imageops import resize
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS

B, SIDE, K = 8, 560, 64  # 8 pages of 20 x 20 cells
QUESTIONS = ["What is the total?", "Date?", "Where is the tax?", "Who sold it?", "Cash?", "Change?", "Items?", "Tip?"]


def make_arr() -> ARR:
    return ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), sampler=SamplerConfig(saccades=K)),
               query_encoder=HashingQueryEncoder()).eval()


@pytest.fixture(scope="module")
def pages(request):
    """B distinct pages: the receipt at SIDE px, page b shifted by 7b px (as benchmarks/bench_vlm.py makes them)."""
    base = resize(load_image(request.config.rootpath / "examples" / "receipt.jpg"), (SIDE, SIDE))
    return [torch.roll(base, shifts=7 * b, dims=2) for b in range(B)]


def test_a_batch_of_8_in_one_pass_equals_8_single_passes(pages):
    arr = make_arr()
    with torch.no_grad():
        batch = arr(pages, QUESTIONS)
        singles = [arr(p, q) for p, q in zip(pages, QUESTIONS)]
    assert batch.positions.shape == (B, K, 2)
    for b, one in enumerate(singles):
        assert torch.equal(batch.positions[b], one.positions[0])  # positions exact
        assert_close_reduction(batch.scores[b], one.scores[0], **ARR_MAP)
        assert torch.equal(batch.patches[b], one.patches[0])  # copies of the same pixels
    # negative control: the pages differ, so comparing page b with its neighbour's single pass fails
    assert not all(torch.equal(batch.positions[b], singles[(b + 1) % B].positions[0]) for b in range(B))


def test_extraction_of_a_samplers_cells_skips_only_the_value_checks(pages):
    arr = make_arr()
    with torch.no_grad():
        out = arr(pages[:2], QUESTIONS[:2])
    px, pos = out.canvas.pixels, out.positions
    assert torch.equal(extract_gather(px, pos, 28, in_bounds=True), extract_loop(px, pos, 28))
    assert_close_reduction(out.patches, extract_loop(px, pos, 28), **CANVAS)
    outside = pos.clone()
    outside[1, 3] = torch.tensor([20, 0])  # one row below the 20-row grid
    with pytest.raises(ValueError, match=r"^extract_gather: position out of bounds at batch 1, saccade 3: cell "
                                         r"\(y=20, x=0\) but the grid is Hc=20 x Wc=20 cells"):
        extract_gather(px, outside, 28)
    with pytest.raises(ValueError, match=r"^positions must be a \[B, K, 2\] \(y, x\) cells tensor, got \(2, 64\)$"):
        extract_gather(px, pos[..., 0], 28, in_bounds=True)  # shapes are still checked


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host reads are only visible on a CUDA device")
def test_selection_and_extraction_on_a_gpu_read_back_once(pages):
    """On a GPU: the sampler (top-K) and the extraction of its cells, inputs already on the device, make exactly
    one synchronising call, the budget check's single read of (NaN count, valid cells per page)."""
    arr = make_arr()
    with torch.no_grad():
        cpu = arr(pages, QUESTIONS)
    dev = torch.device("cuda")
    arr = arr.to(dev)
    rel, valid, px = (x.to(dev) for x in (cpu.relevance.map, cpu.canvas.valid, cpu.canvas.pixels))
    torch.cuda.synchronize(dev)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            selection = arr.select(rel, K, valid=valid)
            patches = extract_gather(px, selection.positions, 28, in_bounds=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert torch.equal(selection.positions.cpu(), cpu.positions)  # the same cells as on the CPU
    assert torch.equal(patches.cpu(), cpu.patches)
