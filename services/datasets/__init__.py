"""Task datasets: SWE-bench-shaped files (``loader``) and weighted mixtures (``mixture``)."""

from services.datasets.loader import SUFFIXES, DatasetError, load_instances

__all__ = ["SUFFIXES", "DatasetError", "load_instances"]
