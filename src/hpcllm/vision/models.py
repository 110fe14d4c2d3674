"""ResNets for the vision benchmark: torchvision's where it imports, else Hugging Face's.

EPICURE's reference is the PyTorch ImageNet example, i.e. torchvision's ``resnet50``;
every cluster image has torchvision. The CPU torch of laptops and CI has no torchvision
build, so there the ``transformers`` ResNet (``ResNetConfig()`` is ResNet-50 v1.5, the
same architecture) stands in. Which one ran is recorded as ``model_impl``.

Both get the zero-init of Goyal et al.: the last BatchNorm's gamma of every residual
block starts at 0, so each block starts as the identity.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

IMPLS = ("auto", "torchvision", "transformers")
MODELS = ("resnet50", "resnet18", "resnet_tiny")

# (block, blocks per stage) for torchvision; the ResNetConfig keys for transformers.
_TORCHVISION = {
    "resnet50": ("Bottleneck", [3, 4, 6, 3]),
    "resnet18": ("BasicBlock", [2, 2, 2, 2]),
    "resnet_tiny": ("BasicBlock", [1, 1, 1, 1]),
}
_TRANSFORMERS = {
    "resnet50": {},
    "resnet18": {
        "layer_type": "basic",
        "depths": [2, 2, 2, 2],
        "hidden_sizes": [64, 128, 256, 512],
    },
    "resnet_tiny": {
        "layer_type": "basic",
        "embedding_size": 8,
        "depths": [1, 1],
        "hidden_sizes": [8, 16],
    },
}


def torchvision_models():
    """``torchvision.models.resnet`` if torchvision imports here, else None."""
    try:
        return importlib.import_module("torchvision.models.resnet")
    except Exception:  # not installed, or a build that does not load next to this torch
        return None


def choose_impl(requested: str = "auto") -> str:
    """``torchvision`` where it imports (or is asked for), else ``transformers``."""
    if requested not in IMPLS:
        raise ValueError(f"model_impl must be one of {', '.join(IMPLS)}, not {requested!r}")
    if requested == "transformers":
        return "transformers"
    if torchvision_models() is not None:
        return "torchvision"
    if requested == "torchvision":
        raise RuntimeError(
            "model_impl: torchvision was asked for, but torchvision does not import in this "
            "environment; install the torchvision build matching torch, or use auto"
        )
    return "transformers"


class _Logits(nn.Module):
    """A transformers classifier as a plain ``images -> logits`` module."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def build_model(name: str, num_classes: int, impl: str = "auto") -> tuple[nn.Module, str]:
    """The model (``images -> logits``) and the implementation chosen."""
    if name not in MODELS:
        raise ValueError(f"unknown vision model {name!r}; known: {', '.join(MODELS)}")
    impl = choose_impl(impl)
    if impl == "torchvision":
        resnet = torchvision_models()
        block, layers = _TORCHVISION[name]
        # zero_init_residual: torchvision's own switch for the zero-init of the last BN gamma
        model = resnet.ResNet(
            getattr(resnet, block), layers, num_classes=num_classes, zero_init_residual=True
        )
        return model, impl
    from transformers import ResNetConfig, ResNetForImageClassification

    hf = ResNetForImageClassification(ResNetConfig(num_labels=num_classes, **_TRANSFORMERS[name]))
    for norm in last_block_norms(hf):
        nn.init.zeros_(norm.weight)
    return _Logits(hf), impl


def last_block_norms(model: nn.Module) -> list[nn.BatchNorm2d]:
    """The BatchNorm closing the residual branch of every block (both implementations)."""
    norms = []
    for module in model.modules():
        kind = type(module).__name__
        if kind == "Bottleneck":  # torchvision
            norms.append(module.bn3)
        elif kind == "BasicBlock":
            norms.append(module.bn2)
        elif kind in ("ResNetBottleNeckLayer", "ResNetBasicLayer"):  # transformers
            norms.append(module.layer[-1].normalization)
    return norms
