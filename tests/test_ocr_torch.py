"""The torch OCR (RapidOCR's ONNX networks as torch modules) reads what ONNX Runtime reads."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx  # declared dependencies: missing, they fail these tests (not skip them)
import pytest
import torch
from PIL import Image

from arr_coc.ocr import DET_LIMIT_SIDE_LEN, PairedLinesOCR, line_groups, rapidocr_engine
from arr_coc.ocr.onnx_graph import OnnxGraph
from arr_coc.ocr.torch_ocr import TorchOCR

EXAMPLES = Path(__file__).resolve().parents[1] / "arr_coc" / "examples"
# Largest difference allowed between a torch network's output and ONNX Runtime's (probabilities in [0, 1]);
# measured: 5e-7 (detection map) and 4.5e-6 (recognition) on random inputs, both on the CPU.
NETWORK_ATOL = 1e-4


def bgr(name: str) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(Image.open(EXAMPLES / name).convert("RGB"))[..., ::-1])


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These tests on one torch thread, then torch's count as it was: on a 2-core machine shared with other work,
    OpenMP's per-operator synchronisation of two threads dominated these many small operators (one detector pass
    on a 288 x 512 px input: 8.6 s on two threads, 0.24 s on one, measured under a load average of 22)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engines() -> tuple[PairedLinesOCR, TorchOCR]:
    return rapidocr_engine(DET_LIMIT_SIDE_LEN, 0.0), rapidocr_engine(DET_LIMIT_SIDE_LEN, 0.0, backend="torch")


@pytest.fixture(scope="module")
def read(engines):
    """Both engines' results on the two text examples (the torch engine reads them in one call)."""
    names = ["form.jpg", "receipt.jpg"]
    theirs = [engines[0](bgr(name)) for name in names]
    return dict(zip(names, zip(theirs, engines[1].read([bgr(name) for name in names]))))


@pytest.fixture(scope="module")
def receipt_lines(engines):
    """A group of six receipt lines as RapidOCR pads them for its recogniser (the input both networks get)."""
    ocr, rec = engines[0].ocr, engines[0].rec
    pre, record = ocr.preprocess_img(ocr.load_img(bgr("receipt.jpg")))
    crops, _ = ocr.detect_and_crop(pre, record)
    group, ratio = line_groups(crops, rec.rec_batch_num, rec.rec_image_shape)[3]  # prices
    return np.concatenate([rec.resize_norm_img(crops[i], ratio)[np.newaxis] for i in group]).astype(np.float32)


@pytest.mark.parametrize("name, lines", [("form.jpg", 33), ("receipt.jpg", 45)])
def test_torch_reads_the_examples_as_onnx_runtime(read, name, lines):
    theirs, ours = read[name]
    assert len(ours.txts) == len(theirs.txts) == lines
    assert ours.txts == theirs.txts
    assert np.abs(np.asarray(ours.boxes) - np.asarray(theirs.boxes)).max() <= 1  # px
    assert np.allclose(ours.scores, theirs.scores, rtol=0, atol=NETWORK_ATOL)


def test_the_detector_gives_onnx_runtimes_map(engines):
    det = engines[1].det
    x = det.get_preprocess()(bgr("form.jpg"))
    with torch.inference_mode():
        ours = engines[1].det_net(torch.from_numpy(x)).numpy()
    theirs = det.session(x)  # RapidOCR's own ONNX Runtime session of the same file
    assert ours.shape == theirs.shape == (1, 1, 960, 736)
    assert np.abs(ours - theirs).max() < NETWORK_ATOL


def test_the_recogniser_gives_onnx_runtimes_probabilities_and_a_perturbed_weight_does_not(engines, receipt_lines):
    ours_net, session = engines[1].rec_net, engines[0].rec.session
    theirs = session(receipt_lines)
    with torch.inference_mode():
        ours = ours_net(torch.from_numpy(receipt_lines)).numpy()
        assert ours.shape == theirs.shape and ours.shape[0] == 6
        assert np.abs(ours - theirs).max() < NETWORK_ATOL
        broken = copy.deepcopy(ours_net)  # the control: the first convolution's weights 1.5 times too large
        name = next(n for n, b in broken.named_buffers() if b.dim() == 4)
        broken.get_buffer(name).mul_(1.5)
        off = broken(torch.from_numpy(receipt_lines)).numpy()
    assert np.abs(off - theirs).max() > 100 * NETWORK_ATOL


def test_images_of_one_size_are_detected_together_as_one_by_one(engines):
    """Detection batched over same-size images (recognition across images: the examples' test reads two at once)."""
    crop = bgr("form.jpg")[:300, :500]
    other = np.ascontiguousarray(crop[:, ::-1])  # the same size, other content
    small = crop[:200]  # another size: a pass of its own
    together = engines[1].detect([crop, other, small, crop])
    alone = [engines[1].detect([image])[0] for image in (crop, other, small)]
    assert len(alone[0].boxes) > 3 and not np.array_equal(alone[0].boxes, alone[1].boxes)
    for ours, single in zip(together, alone + alone[:1]):
        assert np.abs(ours.boxes - single.boxes).max() <= 1  # px
        assert np.allclose(ours.scores, single.scores, rtol=0, atol=NETWORK_ATOL)


def test_an_image_without_text_gives_rapidocrs_empty_result(engines):
    blank = np.full((64, 96, 3), 255, np.uint8)
    ours, theirs = engines[1](blank), engines[0](blank)
    assert ours.txts == theirs.txts and ours.boxes == theirs.boxes and len(ours) == 0


def test_the_factory_builds_one_torch_engine_per_options_and_device():
    engine = rapidocr_engine(backend="torch")
    assert isinstance(engine, TorchOCR) and engine.device == torch.device("cpu")
    assert engine is rapidocr_engine(DET_LIMIT_SIDE_LEN, backend="torch", device="cpu")
    assert isinstance(rapidocr_engine(), PairedLinesOCR)  # the default stays ONNX Runtime


def test_a_bad_backend_or_a_device_for_onnx_runtime_is_refused():
    with pytest.raises(ValueError, match="^unknown OCR backend 'tensorrt': use one of onnxruntime, torch$"):
        rapidocr_engine(backend="tensorrt")
    with pytest.raises(ValueError, match="^the onnxruntime OCR backend runs on the CPU and takes no device "
                                         r"\(got 'cuda'\); use backend='torch' to run the OCR on a torch device$"):
        rapidocr_engine(device="cuda")
    with pytest.raises(ValueError, match="^the OCR's device 'gpu' is no torch device: Expected one of cpu, cuda"):
        rapidocr_engine(backend="torch", device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="^the OCR's device 'cuda:1' needs CUDA, which this torch does not see; "
                                             "use device='cpu' or the default onnxruntime backend$"):
            rapidocr_engine(backend="torch", device="cuda:1")


def test_a_graph_with_an_operator_not_implemented_is_refused():
    helper = onnx.helper
    node = helper.make_node("Tanh", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    with pytest.raises(NotImplementedError, match="^ONNX operators without a torch version here: Tanh$"):
        OnnxGraph(helper.make_model(graph))


@pytest.mark.parametrize("kernel, stride, size", [(2, 1, (5, 6)), (3, 2, (7, 8)), (3, 2, (8, 7))])
def test_same_upper_padding_is_onnx_runtimes(kernel, stride, size):
    """The shipped graphs pad 2x2 convolutions and pools SAME_UPPER at stride 1; other strides and odd sizes too."""
    import onnxruntime

    helper = onnx.helper
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(4, 3, kernel, kernel)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[stride] * 2),
             helper.make_node("MaxPool", ["c"], ["y"], auto_pad="SAME_UPPER", kernel_shape=[kernel] * 2,
                              strides=[stride] * 2)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    x = rng.normal(size=(2, 3, *size)).astype(np.float32)
    theirs = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    ours = OnnxGraph(model)(torch.from_numpy(x)).numpy()
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() < 1e-5
