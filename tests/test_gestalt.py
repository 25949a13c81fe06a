import pytest
import torch
import torch.nn.functional as F
from tolerances import assert_close_reduction

from arr_coc.config import GestaltConfig
from arr_coc.engine.gestalt import PooledGestaltEncoder, adaptive_pool_matrix, pooled_gestalt


def test_pooled_gestalt_equals_adaptive_avg_pool_on_an_unpadded_image():
    x = torch.rand(2, 5, 37, 23)
    g = pooled_gestalt(x, [(37, 23), (37, 23)], (16, 16))
    ref = F.adaptive_avg_pool2d(x, (16, 16)).permute(0, 2, 3, 1).reshape(2, 256, 5)
    # the pool as two matrix products (over 37 rows, then 23 columns) against torch's window sums
    assert_close_reduction(g.tokens, ref, reduction_len=37, depth=2)
    assert_close_reduction(g.vector, x.mean((2, 3)), reduction_len=37 * 23, depth=2)
    assert g.grid == (16, 16) and g.num_tokens == 256


def test_padded_batch_pools_each_image_over_its_own_extent():
    a, b = torch.rand(3, 20, 30), torch.rand(3, 12, 9)
    padded = torch.zeros(2, 3, 20, 30)
    padded[0] = a
    padded[1, :, :12, :9] = b
    g = pooled_gestalt(padded, [(20, 30), (12, 9)], (8, 8))
    for i, img in enumerate((a, b)):
        ref = F.adaptive_avg_pool2d(img[None], (8, 8)).permute(0, 2, 3, 1).reshape(64, 3)
        assert_close_reduction(g.tokens[i], ref, reduction_len=30, depth=2)
        assert_close_reduction(g.vector[i], img.mean((1, 2)), reduction_len=20 * 30, depth=2)


def test_pool_matrix_rows_sum_to_one_and_stay_inside_the_extent():
    m = adaptive_pool_matrix(torch.tensor([7, 16, 3]), 3, 16)
    assert_close_reduction(m.sum(-1), torch.ones(3, 3), reduction_len=16, depth=2)  # 1/size rounded, then summed
    assert m[0, :, 7:].abs().sum() == 0 and m[2, :, 3:].abs().sum() == 0


def test_module_equals_function():
    x = torch.rand(1, 4, 10, 10)
    assert torch.equal(PooledGestaltEncoder()(x, [(10, 10)], (4, 4)).tokens, pooled_gestalt(x, [(10, 10)], (4, 4)).tokens)


def test_gestalt_grid_larger_than_the_image_raises():
    with pytest.raises(ValueError, match=r"gestalt grid \(16, 16\) must fit"):
        pooled_gestalt(torch.rand(1, 3, 8, 8), [(8, 8)], (16, 16))


def test_wrong_shape_raises_with_the_shape():
    with pytest.raises(ValueError, match=r"\[B, C, Hc, Wc\], got \(3, 8, 8\)"):
        pooled_gestalt(torch.rand(3, 8, 8), [(8, 8)], (2, 2))


def test_gestalt_grid_shrinks_for_small_budgets_and_small_images():
    cfg = GestaltConfig()
    assert cfg.grid_for(273, (48, 48)) == (16, 16)
    assert cfg.grid_for(127, (48, 48)) == (8, 8)
    assert cfg.grid_for(273, (6, 40)) == (6, 16)
    assert GestaltConfig(grid=(4, 6)).grid_for(500, (48, 48)) == (4, 6)
