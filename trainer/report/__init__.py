"""``python -m trainer report RUN_DIR``: the training run's dashboard (PNG) and text summary.

``load`` reads and validates ``metrics.jsonl``, ``summary`` computes the summary numbers (pure),
``dashboard`` draws the PNG (matplotlib, Agg), ``cli`` is the command. docs/training.md
"How to read the dashboard".
"""
