"""The EPICURE training recipe on the real models: zero-init of the last BN gamma of every
residual block, no weight decay on BN and biases, linear LR scaling with warm-up, label
smoothing; and which ResNet implementation is chosen."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from hpcllm.vision import models
from hpcllm.vision.recipe import loss_function, make_optimizer, param_groups, scaled_lr


def test_fallback_resnet50_starts_every_residual_block_as_identity():
    model, impl = models.build_model("resnet50", 10, "transformers")
    assert impl == "transformers"
    norms = models.last_block_norms(model)
    assert len(norms) == 3 + 4 + 6 + 3  # one per bottleneck block of ResNet-50
    assert all(torch.count_nonzero(n.weight) == 0 for n in norms)
    others = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d) and m not in norms]
    assert others and all(torch.all(m.weight == 1) for m in others)
    # a block whose residual branch ends in gamma 0 passes its input through unchanged
    block = next(m for m in model.modules() if type(m).__name__ == "ResNetBottleNeckLayer")
    block.eval()
    x = torch.randn(1, block.shortcut.convolution.in_channels, 8, 8).relu()
    if isinstance(block.shortcut, nn.Identity):
        assert torch.equal(block(x), x)
    else:
        assert torch.allclose(block(x), torch.relu(block.shortcut(x)))


def test_no_weight_decay_on_batchnorm_and_biases():
    model, _ = models.build_model("resnet_tiny", 4, "transformers")
    decay, no_decay = param_groups(model, 1e-4)
    assert decay["weight_decay"] == 1e-4 and no_decay["weight_decay"] == 0.0
    bn_and_bias = {
        id(p)
        for name, p in model.named_parameters()
        if name.endswith("bias") or "normalization" in name
    }
    assert {id(p) for p in no_decay["params"]} == bn_and_bias
    assert all(p.ndim == 4 or p.ndim == 2 for p in decay["params"])  # conv and linear weights
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_learning_rate_scales_with_the_batch_and_warms_up_linearly():
    assert scaled_lr(0.1, 8192) == pytest.approx(3.2)  # Goyal et al.: 0.1 per 256
    model, _ = models.build_model("resnet_tiny", 4, "transformers")
    settings = {"learning_rate": 0.1, "warmup_epochs": 2, "momentum": 0.9}
    optimizer, schedule, target = make_optimizer(model, settings, 1024, steps_per_epoch=10)
    assert target == pytest.approx(0.4)
    assert all(g["momentum"] == 0.9 for g in optimizer.param_groups)
    rates = []
    for _ in range(25):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    # from the unscaled 0.1 to 0.4 over 20 steps, then constant
    assert rates[0] == pytest.approx(0.1)
    assert rates[10] == pytest.approx(0.25)
    assert rates[20:] == pytest.approx([0.4] * 5)
    assert all(b >= a for a, b in zip(rates, rates[1:]))
    assert optimizer.param_groups[1]["lr"] == optimizer.param_groups[0]["lr"]


def test_label_smoothing_is_optional():
    logits, y = torch.tensor([[4.0, 0.0, 0.0]]), torch.tensor([0])
    plain = loss_function({})(logits, y)
    smoothed = loss_function({"label_smoothing": 0.1})(logits, y)
    assert plain == pytest.approx(nn.functional.cross_entropy(logits, y))
    assert smoothed > plain


def test_torchvision_does_not_import_next_to_the_cpu_torch_so_transformers_stands_in():
    if models.torchvision_models() is not None:
        pytest.skip("torchvision imports here: the real one is tested below")
    assert models.choose_impl("auto") == "transformers"
    with pytest.raises(RuntimeError, match="torchvision does not import"):
        models.choose_impl("torchvision")
    with pytest.raises(ValueError, match="model_impl"):
        models.choose_impl("timm")


def test_torchvision_is_chosen_when_it_imports(monkeypatch):
    """torchvision cannot load next to this machine's CPU torch; a module standing in for
    ``torchvision.models.resnet`` shows that auto picks it and how it is called."""
    calls = []

    class BasicBlock(nn.Module):
        pass

    class Bottleneck(nn.Module):
        pass

    class ResNet(nn.Linear):
        def __init__(self, block, layers, num_classes, zero_init_residual):
            super().__init__(3, num_classes)
            calls.append((block, layers, num_classes, zero_init_residual))

    resnet = types.ModuleType("torchvision.models.resnet")
    resnet.BasicBlock, resnet.Bottleneck, resnet.ResNet = BasicBlock, Bottleneck, ResNet
    package = types.ModuleType("torchvision")
    package.__path__ = []
    sub = types.ModuleType("torchvision.models")
    sub.__path__ = []
    sub.resnet = resnet
    for name, module in (
        ("torchvision", package),
        ("torchvision.models", sub),
        ("torchvision.models.resnet", resnet),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    model, impl = models.build_model("resnet50", 7)
    assert impl == "torchvision" and isinstance(model, ResNet)
    assert calls == [(Bottleneck, [3, 4, 6, 3], 7, True)]
    assert models.build_model("resnet50", 7, "transformers")[1] == "transformers"


def test_real_torchvision_resnet50():
    resnet = pytest.importorskip("torchvision.models.resnet")
    model, impl = models.build_model("resnet50", 10, "torchvision")
    assert impl == "torchvision" and isinstance(model, resnet.ResNet)
    norms = models.last_block_norms(model)
    assert len(norms) == 16 and all(torch.count_nonzero(n.weight) == 0 for n in norms)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)
