"""ImageNet preprocessing in Pillow and NumPy, the steps of torchvision's transforms
(which the CPU torch of these machines cannot have): training is RandomResizedCrop
(scale 0.08-1, ratio 3/4-4/3) and a horizontal flip, validation is a resize of the
shorter side to size/0.875 (256 for 224) and a central crop; both normalise with the
ImageNet mean and standard deviation."""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def to_normalised_tensor(image: Image.Image) -> torch.Tensor:
    array = (np.asarray(image, dtype=np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


class TrainTransform:
    def __init__(self, size: int) -> None:
        self.size = size

    def crop_box(self, width: int, height: int) -> tuple[int, int, int, int]:
        area = width * height
        for _ in range(10):
            target = area * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            w = round(math.sqrt(target * ratio))
            h = round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                x, y = random.randint(0, width - w), random.randint(0, height - h)
                return x, y, x + w, y + h
        side = min(width, height)  # fallback: the central square
        x, y = (width - side) // 2, (height - side) // 2
        return x, y, x + side, y + side

    def __call__(self, image: Image.Image) -> torch.Tensor:
        image = image.resize((self.size, self.size), Image.BILINEAR, box=self.crop_box(*image.size))
        if random.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return to_normalised_tensor(image)


class ValTransform:
    def __init__(self, size: int) -> None:
        self.size = size
        self.resize = round(size / 0.875)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        w, h = image.size
        scale = self.resize / min(w, h)
        image = image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BILINEAR)
        w, h = image.size
        x, y = (w - self.size) // 2, (h - self.size) // 2
        return to_normalised_tensor(image.crop((x, y, x + self.size, y + self.size)))
