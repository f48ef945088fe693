"""``python -m trainer report RUN_DIR [--output PNG]``: the run's dashboard and summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.loop.evaluation import EVAL_FILE
from trainer.loop.metrics import read_jsonl
from trainer.report.load import ReportError, find_metrics, load_rows
from trainer.report.summary import render_text, summarize

DESCRIPTION = """\
Report on a training run of `python -m trainer train`: reads its per-step metrics
(RUN_DIR/metrics.jsonl, or RUN_DIR/train/metrics.jsonl for a toy/demo run directory) and writes

  * a PNG dashboard (default RUN_DIR/report.png): reward per step by phase with a rolling mean,
    and the held-out evaluations (eval.jsonl next to metrics.jsonl, train.eval_interval),
    policy lag (mean/max), off-policy token ratio, train/rollout logprob mismatch, critic
    explained variance and ranking accuracy (when logged), and the step time split; the Li2SAO
    switch step is a red dashed line on every panel;
  * a text summary, printed and written to RUN_DIR/report.txt: steps, reward over the first
    and last 5 steps, the switch step (or "no switch"), the policy lag before and after the
    switch, the mean step time, the held-out evaluations.

A run still in progress can be reported: a half-written last line is skipped. Any other bad
line is an error naming the file and line. See docs/training.md "How to read the dashboard".
"""

EPILOG = """\
exit status: 0 written, 2 bad input (no run directory, no metrics, an empty or corrupt line).

examples:
  python -m trainer report runs/toy-li2sao
  python -m trainer report runs/toy-li2sao --output /tmp/dash.png --window 20
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trainer report",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (train.run_dir)")
    p.add_argument(
        "--output", metavar="PNG", help="where to write the dashboard (RUN_DIR/report.png)"
    )
    p.add_argument("--window", type=int, default=10, metavar="N",
                   help="steps in the reward's rolling mean (10)")  # fmt: skip
    p.add_argument("--edge", type=int, default=5, metavar="N",
                   help="steps averaged at the start and end of the run (5)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.window < 1 or args.edge < 1:
        print("error: --window and --edge must be >= 1", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir)
    try:
        path = find_metrics(run_dir)
        rows, torn = load_rows(path)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if torn:
        print(f"note: {path}: the last line is incomplete (run in progress): skipped",
              file=sys.stderr)  # fmt: skip
    from trainer.report.dashboard import draw  # matplotlib only once the input is good

    output = Path(args.output) if args.output else run_dir / "report.png"
    evals = read_jsonl(path.parent / EVAL_FILE)  # the held-out evaluations, if any
    text = render_text(summarize(rows, args.edge, evals), str(path))
    try:
        draw(rows, output, title=f"training run {run_dir.resolve().name}", window=args.window,
             evals=evals)  # fmt: skip
        (run_dir / "report.txt").write_text(text)
    except OSError as exc:
        print(f"error: cannot write the report: {exc}", file=sys.stderr)
        return 2
    print(text, end="")
    print(f"dashboard: {output}\nsummary: {run_dir / 'report.txt'}")
    return 0
