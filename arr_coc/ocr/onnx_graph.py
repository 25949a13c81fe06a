"""An ONNX graph run by torch ops: the PP-OCR networks RapidOCR ships, as an ``nn.Module`` on any device.

RapidOCR's own torch networks (``rapidocr.inference_engine.pytorch``) are not the graphs its wheel ships: the
ONNX files were exported with every batch norm folded into its convolution and the re-parameterised branches
merged (PP-OCRv6 small detection: 83 convolutions and no batch norm in the ONNX graph, 106 convolutions and 74
batch norms in ``PPLCNetV4`` + ``RepLKFPN`` + ``DBHead``), so their state_dicts do not map onto the shipped
weights. This module instead runs the shipped graph node by node with torch ops, for exactly the operators the
two graphs use (:data:`OPS`); any other operator is refused when the graph is loaded, not guessed at.

The floating-point initializers are buffers (``module.to(device)`` moves them); the integer ones are shape
arithmetic (``Reshape``'s target, ``Slice``'s bounds) and stay on the CPU with the ``Shape`` results, so a
graph on an accelerator never waits for a shape to come back from it.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from arr_coc.errors import MissingDependencyError

INSTALL_ONNX = "pip install onnx"


def require_onnx(what: str) -> Any:
    """The ``onnx`` module, or a MissingDependencyError saying ``what`` needs it and how to install it."""
    try:
        import onnx
    except ImportError as err:
        raise MissingDependencyError(f"{what} needs the onnx package to read the model files: {INSTALL_ONNX}") from err
    return onnx


def _same_upper(x: torch.Tensor, kernel: list[int], strides: list[int], dilations: list[int], value: float):
    """``x`` padded as ONNX's ``auto_pad=SAME_UPPER`` pads it (the odd pixel at the end)."""
    pads: list[int] = []
    for axis, k, s, d in reversed(list(zip(range(2, x.dim()), kernel, strides, dilations))):
        size = x.shape[axis]
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads, value=value)


def _conv(x, w, b=None, *, strides=(1, 1), dilations=(1, 1), group=1, pads=None, auto_pad=b"NOTSET",
          kernel_shape=None):
    strides, dilations = list(strides), list(dilations)  # ONNX's defaults when the attribute is left out
    if auto_pad == b"SAME_UPPER":
        x, pads = _same_upper(x, list(w.shape[2:]), strides, dilations, 0.0), [0] * 4
    elif auto_pad not in (b"NOTSET", b""):
        raise NotImplementedError(f"Conv auto_pad={auto_pad!r}")
    pads = pads or [0] * 4
    if pads[:2] != pads[2:]:  # ONNX gives begins then ends; F.conv2d pads both sides alike
        x, pads = F.pad(x, [pads[1], pads[3], pads[0], pads[2]]), [0] * 4
    return F.conv2d(x, w, b, stride=strides, padding=pads[:2], dilation=dilations, groups=group)


def _conv_transpose(x, w, b=None, *, strides=(1, 1), dilations=(1, 1), group=1, pads=(0, 0, 0, 0),
                    kernel_shape=None):
    if any(pads):
        raise NotImplementedError("ConvTranspose with pads")
    return F.conv_transpose2d(x, w, b, stride=strides, dilation=dilations, groups=group)


def _max_pool(x, *, kernel_shape, strides=(1, 1), auto_pad=b"NOTSET", ceil_mode=0, pads=None):
    if auto_pad == b"SAME_UPPER":
        x = _same_upper(x, kernel_shape, list(strides), [1, 1], -math.inf)
    elif pads and any(pads):
        raise NotImplementedError("MaxPool with explicit pads")
    return F.max_pool2d(x, kernel_shape, strides, ceil_mode=bool(ceil_mode))


def _avg_pool(x, *, kernel_shape, strides, pads, ceil_mode, count_include_pad):
    if any(pads):
        raise NotImplementedError("AveragePool with pads")
    return F.avg_pool2d(x, kernel_shape, strides, ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


def _resize(x, roi=None, scales=None, sizes=None, *, mode, coordinate_transformation_mode, nearest_mode):
    # the one variant the graphs use: nearest, asymmetric, floor, by whole scales: each pixel repeated
    if (mode, coordinate_transformation_mode, nearest_mode) != (b"nearest", b"asymmetric", b"floor"):
        raise NotImplementedError(f"Resize mode={mode!r} {coordinate_transformation_mode!r} {nearest_mode!r}")
    factors = [float(s) for s in scales.tolist()]
    if factors[:2] != [1.0, 1.0] or any(f != int(f) for f in factors[2:]):
        raise NotImplementedError(f"Resize by scales {factors}")
    return x.repeat_interleave(int(factors[2]), dim=2).repeat_interleave(int(factors[3]), dim=3)


def _reshape(x, shape):
    target = [x.shape[i] if s == 0 else s for i, s in enumerate(shape.tolist())]  # ONNX: 0 keeps that dim
    return x.reshape(target)


def _slice(x, starts, ends, axes=None, steps=None):
    starts, ends = starts.tolist(), ends.tolist()
    axes = axes.tolist() if axes is not None else list(range(len(starts)))
    steps = steps.tolist() if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.dim()
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step != 1:
            raise NotImplementedError("Slice with steps")
        index[axis] = slice(start, min(end, x.shape[axis]))
    return x[tuple(index)]


def _squeeze(x, *, axes):
    for axis in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(axis)
    return x


def _unsqueeze(x, *, axes):
    for axis in sorted(axes):
        x = x.unsqueeze(axis)
    return x


def _batch_norm(x, scale, bias, mean, var, *, epsilon, momentum=None):
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, epsilon)


def _reduce_mean(x, *, axes, keepdims=1):
    return x.mean(dim=axes, keepdim=bool(keepdims))


OPS: dict[str, Callable[..., torch.Tensor]] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _max_pool,
    "AveragePool": _avg_pool,
    "GlobalAveragePool": lambda x: x.mean(dim=(2, 3), keepdim=True),
    "BatchNormalization": _batch_norm,
    "Resize": _resize,
    "Identity": lambda x: x,
    "Add": torch.add,
    "Sub": torch.sub,
    "Mul": torch.mul,
    "Div": torch.div,
    "Pow": torch.pow,
    "Sqrt": torch.sqrt,
    "Erf": torch.erf,
    "Relu": torch.relu,
    "Sigmoid": torch.sigmoid,
    "HardSigmoid": lambda x, *, alpha, beta: (x * alpha + beta).clamp(0.0, 1.0),
    "MatMul": torch.matmul,
    "Softmax": lambda x, *, axis: torch.softmax(x, dim=axis),
    "ReduceMean": _reduce_mean,
    "Concat": lambda *xs, axis: torch.cat(xs, dim=axis),
    "Transpose": lambda x, *, perm: x.permute(*perm),
    "Reshape": _reshape,
    "Slice": _slice,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Shape": lambda x: torch.tensor(list(x.shape), dtype=torch.int64),  # on the CPU: shape arithmetic
}


class OnnxGraph(nn.Module):
    """An ONNX model's graph as a module: ``forward(x)`` runs its nodes in order on the inputs' device.

    Only single-input, single-output graphs of the operators in :data:`OPS` (ONNX opset 11 semantics);
    a graph using another operator is refused with its name. Intermediate values are dropped after their last
    use, so a pass holds what ONNX Runtime's would, not every activation at once.
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        onnx = require_onnx("the torch OCR")
        graph = model.graph
        unknown = sorted({node.op_type for node in graph.node} - set(OPS))
        if unknown:
            raise NotImplementedError(f"ONNX operators without a torch version here: {', '.join(unknown)}")
        if len(graph.input) != 1 or len(graph.output) != 1:
            raise NotImplementedError("only graphs with one input and one output")
        several = sorted({node.op_type for node in graph.node if len(node.output) > 1})
        if several:  # e.g. a training-mode BatchNormalization's running statistics
            raise NotImplementedError(f"ONNX nodes with several outputs: {', '.join(several)}")
        self.input_name, self.output_name = graph.input[0].name, graph.output[0].name
        self._buffer_of: dict[str, str] = {}
        self._ints: dict[str, torch.Tensor] = {}  # and Resize's scales: read on the CPU, never from the device
        on_cpu = {name for node in graph.node if node.op_type == "Resize" for name in node.input[1:]}
        for k, init in enumerate(graph.initializer):
            array = onnx.numpy_helper.to_array(init)
            if init.name in on_cpu:
                self._ints[init.name] = torch.from_numpy(array.copy())
            elif np.issubdtype(array.dtype, np.floating):
                self._buffer_of[init.name] = f"w{k}"
                self.register_buffer(f"w{k}", torch.from_numpy(array.astype(np.float32, copy=True)))
            else:
                self._ints[init.name] = torch.from_numpy(array.astype(np.int64, copy=True))
        self.nodes = [(node.op_type, list(node.input), list(node.output),
                       {a.name: _attribute(onnx, a) for a in node.attribute}) for node in graph.node]
        last_use: dict[str, int] = {}
        for k, (_, inputs, _, _) in enumerate(self.nodes):
            for name in inputs:
                last_use[name] = k
        self._drop_after = [[n for n in inputs if last_use.get(n) == k] for k, (_, inputs, _, _) in
                            enumerate(self.nodes)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values: dict[str, Any] = {self.input_name: x}
        for (op, inputs, outputs, attrs), drop in zip(self.nodes, self._drop_after):
            args = [self._value(values, name) for name in inputs]
            values[outputs[0]] = OPS[op](*args, **attrs)
            for name in drop:
                values.pop(name, None)
        return values[self.output_name]

    def _value(self, values: dict[str, Any], name: str) -> Any:
        if name == "":  # an optional input left out (Resize's roi)
            return None
        if name in values:
            return values[name]
        if name in self._buffer_of:
            return getattr(self, self._buffer_of[name])
        return self._ints[name]


def _attribute(onnx: Any, attribute: Any) -> Any:
    value = onnx.helper.get_attribute_value(attribute)
    return value if isinstance(value, (bytes, int, float)) else list(value)  # ints, floats: a list
