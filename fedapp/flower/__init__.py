"""The Flower layer: what every method's strategy and client share on top of the
Flower-free core (the base strategy, the DP and SecAgg+ wrappers, the in-process
driver). Nothing below this package imports ``flwr``."""
