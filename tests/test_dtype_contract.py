"""The API's dtype / layout / device contract: an ARR in any floating dtype works, image tensors convert or refuse."""
from __future__ import annotations

import pytest
import torch
from tolerances import ARR_MAP, assert_close_reduction

from arr_coc.config import MVP_CHANNELS, ARRConfig, SamplerConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.samplers import SAMPLERS

Q = "What is the total?"
K = 20


def _arr(sampler: str = "topk") -> ARR:
    cfg = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), sampler=SamplerConfig(name=sampler))
    return ARR(cfg, query_encoder=HashingQueryEncoder()).eval()


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return torch.rand(3, 112, 140, generator=torch.Generator().manual_seed(0))


def _cells(out) -> set[tuple[int, int]]:
    return set(map(tuple, out.positions[0].tolist()))


@pytest.mark.parametrize("sampler", SAMPLERS.names())
def test_an_arr_in_float64_allocates_as_in_float32(sampler, image):
    ref = _arr(sampler)(image, Q, saccades=K)
    for moved in (_arr(sampler).double(), _arr(sampler).to(torch.float64)):
        out = moved(image, Q, saccades=K)
        assert out.relevance.map.dtype == torch.float64
        assert_close_reduction(out.relevance.map, ref.relevance.map, **ARR_MAP)
        assert torch.equal(out.positions, ref.positions)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sampler", ["topk", "adaptive_stratified", "log_polar"])
def test_an_arr_in_half_precision_allocates_close_to_float32(sampler, dtype, image):
    ref = _arr(sampler)(image, Q, saccades=K)
    out = _arr(sampler).to(dtype)(image, Q, saccades=K)
    assert out.relevance.map.dtype == dtype
    assert_close_reduction(out.relevance.map.float(), ref.relevance.map, dtype=dtype, **ARR_MAP)
    assert len(_cells(out) & _cells(ref)) >= 0.8 * K  # measured: all 20 cells (bfloat16 reorders ties)


def test_an_arr_with_weights_it_cannot_compute_with_refuses_in_one_line(image):
    with pytest.raises(ValueError, match=r"^the ARR is on the meta device: its weights hold no data; build it on a "
                                         r"real device \(ARR\(config\)\) or move it with arr.to_empty"):
        _arr().to("meta")(image, Q, saccades=K)
    with pytest.raises(TypeError, match=r"^an ARR in complex64 cannot score; move it to a real floating dtype: "
                                        r"arr.float\(\) \(or .double\(\), .half\(\), .bfloat16\(\)\)$"):
        _arr().to(torch.complex64)(image, Q, saccades=K)
    arr = _arr()
    scene = arr.see(image)
    arr.scorer.to("meta")  # allocate() on a scene checks too
    with pytest.raises(ValueError, match="the ARR is on the meta device"):
        arr.allocate(scene, Q, saccades=K)


@pytest.mark.parametrize("convert", [
    pytest.param(lambda x: x.double(), id="float64"),
    pytest.param(lambda x: x.transpose(1, 2).contiguous().transpose(1, 2), id="non-contiguous"),
    pytest.param(lambda x: x[None].contiguous(memory_format=torch.channels_last), id="channels-last batch"),
    pytest.param(lambda x: x[:, ::1, :], id="view"),
    pytest.param(lambda x: x.clone().requires_grad_(), id="requires-grad"),
])
def test_image_tensors_of_any_float_layout_give_the_float32_allocation(convert, image):
    arr = _arr()
    ref = arr(image, Q, saccades=K)
    out = arr(convert(image), Q, saccades=K)
    assert torch.equal(out.positions, ref.positions) and torch.equal(out.relevance.map, ref.relevance.map)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_image_tensors_read_as_their_float32_values(dtype, image):
    arr = _arr()
    low = image.to(dtype)
    assert torch.equal(arr(low, Q, saccades=K).positions, arr(low.float(), Q, saccades=K).positions)
    assert not torch.equal(low.float(), image)  # the precision really was lower


@pytest.mark.parametrize("make, error, message", [
    (lambda x: (x * 255).long(), TypeError,
     "tensor image of dtype torch.int64 is not supported; pass float in [0, 1], uint8 (0-255) or bool"),
    (lambda x: (x * 255).int()[None], TypeError,
     "tensor image of dtype torch.int32 is not supported; pass float in [0, 1], uint8 (0-255) or bool"),
    (lambda x: x.to(torch.complex64), TypeError,
     "tensor image of dtype torch.complex64 is not supported; pass float in [0, 1], uint8 (0-255) or bool"),
    (lambda x: x.to_sparse(), TypeError,
     "tensor image has layout torch.sparse_coo; pass a dense tensor (x.to_dense() if it is small)"),
    (lambda x: x[None].to_sparse(), TypeError,
     "tensor image has layout torch.sparse_coo; pass a dense tensor (x.to_dense() if it is small)"),
    (lambda x: x.to_sparse_csr(), TypeError, "tensor image has layout torch.sparse_csr"),
    (lambda x: x.to("meta"), ValueError, "tensor image is on the meta device and holds no pixels; pass a tensor with data"),
    (lambda x: x[None].to("meta"), ValueError, "tensor image is on the meta device and holds no pixels"),
])
def test_image_tensors_the_api_does_not_take_are_refused_in_one_line(make, error, message, image):
    with pytest.raises(error) as info:
        _arr()(make(image), Q, saccades=K)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
