"""The CNN zoo: heterogeneous client models, described as data.

``cnn-1`` .. ``cnn-5`` are the five heterogeneous CNNs of pFedLoRA; they differ
only in the second conv's width and the first fully connected layer, and all
share a 500-d representation before the classifier. ``fedavg-cnn`` is the CIFAR
CNN of the FedAvg paper (McMahan et al., 2017) as other FL libraries publish it
(two unpadded 5x5 convs with 32 and 64 channels, each max-pooled, a 512-unit
hidden layer): the same family of layers, so it is a config here too.
``vgg-2`` .. ``vgg-4`` are the small VGG-block CNNs used as FedD2P clients.

Every model exposes ``features(x)`` (the representation methods attach
adapters or prototypes to), ``head`` (the final ``nn.Linear``), ``feature_dim``
and ``forward(x) == head(features(x))``.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from fedapp.errors import ModelError
from fedapp.models.zoo_configs import CNN_CONFIGS, CNN_FEATURE_DIM, VGG_CONFIGS, CNNConfig, VGGConfig

__all__ = [
    "CNN_CONFIGS",
    "CNN_FEATURE_DIM",
    "VGG_CONFIGS",
    "CNNConfig",
    "HeteroCNN",
    "SmallVGG",
    "VGGConfig",
    "cnn_spatial_size",
]

_KERNEL = 5


def _check_common(num_classes: int, in_channels: int, image_size: int) -> None:
    for label, value in (
        ("num_classes", num_classes),
        ("in_channels", in_channels),
        ("image_size", image_size),
    ):
        # bool is an int subclass; True classes is a config mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"{label} must be a positive int, got {value!r}")


def cnn_spatial_size(image_size: int) -> int:
    """Side of the feature map a ``cnn-*`` model flattens.

    Two rounds of an unpadded 5x5 conv then a 2x2 max-pool (32 -> 28 -> 14 ->
    10 -> 5).

    Parameters
    ----------
    image_size : int
        Side of the square input image.

    Returns
    -------
    int
        Side of the last feature map; below 1 means the image is too small.
    """
    side = image_size
    for _ in range(2):
        side = (side - (_KERNEL - 1)) // 2
    return side


class HeteroCNN(nn.Module):
    """One of the two-conv CNNs of :data:`CNN_CONFIGS`.

    Conv(in->c1, 5x5) -> ReLU -> MaxPool2 -> Conv(c1->c2, 5x5) -> ReLU ->
    MaxPool2 -> flatten -> FC1 -> ReLU [-> FC2(->500) -> ReLU] -> head.

    Parameters
    ----------
    config : CNNConfig
        Which member of the family to build.
    num_classes : int
        Output width of ``head``.
    image_size : int, default 32
        Side of the square input; sets the flatten size.
    in_channels : int, default 3
        Channels of the input image.

    Raises
    ------
    ModelError
        If a size is not a positive int or the image is too small for two
        conv/pool stages (under 16 pixels).
    """

    def __init__(
        self,
        config: CNNConfig,
        num_classes: int,
        *,
        image_size: int = 32,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        _check_common(num_classes, in_channels, image_size)
        side = cnn_spatial_size(image_size)
        if side < 1:
            raise ModelError(f"image_size {image_size} is too small for a cnn-* model (needs >= 16)")
        self.config = config
        self.feature_dim = config.representation or config.fc1_out
        self.conv1 = nn.Conv2d(in_channels, config.conv1_channels, _KERNEL)
        self.conv2 = nn.Conv2d(config.conv1_channels, config.conv2_channels, _KERNEL)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(config.conv2_channels * side * side, config.fc1_out)
        self.fc2 = nn.Linear(config.fc1_out, config.representation) if config.representation else None
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Return the representation: ``ReLU(FC2(...))`` (500-d), or ``ReLU(FC1(...))`` without FC2.

        Parameters
        ----------
        x : torch.Tensor
            Images, shape ``(B, in_channels, image_size, image_size)``.

        Returns
        -------
        torch.Tensor
            Shape ``(B, feature_dim)``.
        """
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        return torch.relu(self.fc2(x)) if self.fc2 is not None else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits ``head(features(x))``, shape ``(B, num_classes)``."""
        return self.head(self.features(x))


def _vgg_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, padding=1),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class SmallVGG(nn.Module):
    """A small VGG-block CNN (FedD2P client model).

    Each block is Conv3x3 -> BN -> ReLU -> Conv3x3 -> BN -> ReLU -> MaxPool2;
    the blocks are followed by global average pooling (``features``) and a
    linear ``head``.

    Parameters
    ----------
    config : VGGConfig
        Channels of each block.
    num_classes : int
        Output width of ``head``.
    image_size : int, default 32
        Side of the square input; each block halves it.
    in_channels : int, default 3
        Channels of the input image.

    Raises
    ------
    ModelError
        If a size is not a positive int or the image would shrink below one
        pixel.
    """

    def __init__(
        self,
        config: VGGConfig,
        num_classes: int,
        *,
        image_size: int = 32,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        _check_common(num_classes, in_channels, image_size)
        if not config.channels:
            raise ModelError("a VGG config needs at least one block")
        min_size = 2 ** len(config.channels)
        if image_size < min_size:
            raise ModelError(
                f"image_size {image_size} is too small for {len(config.channels)} VGG blocks (needs >= {min_size})"
            )
        self.config = config
        widths = (in_channels, *config.channels)
        self.blocks = nn.Sequential(*(_vgg_block(c_in, c_out) for c_in, c_out in itertools.pairwise(widths)))
        self.feature_dim = config.channels[-1]
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Return the globally average-pooled last block, shape ``(B, feature_dim)``."""
        return torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(x), 1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits ``head(features(x))``, shape ``(B, num_classes)``."""
        return self.head(self.features(x))
