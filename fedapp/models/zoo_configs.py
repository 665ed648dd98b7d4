"""The CNN zoo's architectures as data (:mod:`fedapp.models.cnn` builds them): torch-free, so that the
run configuration can name the zoo's models (:data:`fedapp.models.MODEL_NAMES`) without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CNN_CONFIGS", "CNN_FEATURE_DIM", "VGG_CONFIGS", "CNNConfig", "VGGConfig"]

# Shared by every cnn-* model so that representations are comparable across clients.
CNN_FEATURE_DIM = 500


@dataclass(frozen=True)
class CNNConfig:
    """Architecture of one two-conv CNN (pFedLoRA's family, FedAvg's CIFAR CNN).

    Parameters
    ----------
    conv2_channels : int
        Output channels of the second 5x5 convolution.
    fc1_out : int
        Output width of the first fully connected layer.
    conv1_channels : int
        Output channels of the first 5x5 convolution.
    representation : int or None
        Width of FC2, the representation before the head; None: no FC2, the
        ReLU of FC1 is the representation.
    """

    conv2_channels: int
    fc1_out: int
    conv1_channels: int = 16
    representation: int | None = CNN_FEATURE_DIM


@dataclass(frozen=True)
class VGGConfig:
    """Architecture of one small VGG-block CNN.

    Parameters
    ----------
    channels : tuple of int
        Output channels of each VGG block; one block per entry.
    """

    channels: tuple[int, ...]


CNN_CONFIGS: dict[str, CNNConfig] = {
    "cnn-1": CNNConfig(conv2_channels=32, fc1_out=2000),
    "cnn-2": CNNConfig(conv2_channels=16, fc1_out=2000),
    "cnn-3": CNNConfig(conv2_channels=32, fc1_out=1000),
    "cnn-4": CNNConfig(conv2_channels=32, fc1_out=800),
    "cnn-5": CNNConfig(conv2_channels=32, fc1_out=500),
    "fedavg-cnn": CNNConfig(conv2_channels=64, fc1_out=512, conv1_channels=32, representation=None),
}

_VGG_CHANNELS = (32, 64, 128, 256)
VGG_CONFIGS: dict[str, VGGConfig] = {f"vgg-{depth}": VGGConfig(channels=_VGG_CHANNELS[:depth]) for depth in (2, 3, 4)}
