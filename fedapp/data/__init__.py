"""Data sources, client partitions, per-client splits and tensor helpers."""

from fedapp.data.partition import PARTITIONS, partition_indices
from fedapp.data.sources import SOURCES, ArrayDataset, load_source
from fedapp.data.splits import ClientSplit, sample_external_test, split_stratified

__all__ = [
    "PARTITIONS",
    "SOURCES",
    "ArrayDataset",
    "ClientSplit",
    "load_source",
    "partition_indices",
    "sample_external_test",
    "split_stratified",
]
