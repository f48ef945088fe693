"""The trainer service: claims train jobs of the job API and runs one training process each
(``python -m trainer serve``, see :mod:`trainer.service.cli` and docs/training.md)."""
