"""``python -m trainer COMMAND``: the trainer's command-line tools (``score``, ``train``,
``report``: a run's dashboard PNG and summary, ``serve``: the trainer service that runs the job
API's train jobs)."""

from __future__ import annotations

import sys

COMMANDS = ("score", "train", "report", "serve")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print(f"usage: python -m trainer {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    if args[0] == "train":
        from trainer.loop.cli import main as train

        return train(args[1:])
    if args[0] == "report":
        from trainer.report.cli import main as report

        return report(args[1:])
    if args[0] == "serve":
        from trainer.service.cli import main as serve

        return serve(args[1:])
    from trainer.score import main as score

    return score(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
