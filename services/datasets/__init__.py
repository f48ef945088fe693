"""Task datasets: SWE-bench-shaped files (``loader``) and weighted mixtures (``mixture``)."""

from services.datasets.loader import (
    SUFFIXES,
    DatasetError,
    RowError,
    load_instances,
    load_instances_collect,
)

__all__ = ["SUFFIXES", "DatasetError", "RowError", "load_instances", "load_instances_collect"]
