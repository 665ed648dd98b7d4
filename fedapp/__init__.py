"""Flower federated-learning app for parameter-efficient adaptation."""
