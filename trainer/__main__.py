"""``python -m trainer COMMAND``: the trainer's command-line tools (``score``, ``train``,
``report``: a run's dashboard PNG and summary, ``serve``: the trainer service that runs the job
API's train jobs, ``reshard``: a megatron checkpoint rewritten for another model-parallel
layout)."""

from __future__ import annotations

import sys

COMMANDS = ("score", "train", "report", "serve", "reshard")
HELP = """\
usage: python -m trainer COMMAND [OPTIONS]   (python -m trainer COMMAND --help: its options)

commands:
  score    per-token log-probabilities of given sequences under a model (the trainer
           backend's forward: the train / rollout mismatch check)
  train    the training loop: rollouts through the rollout manager, Li2SAO (or a baseline)
           on the trainer backend, each new version published to the adapter
  report   a training run's PNG dashboard and summary from its metrics.jsonl
  serve    the trainer service: claims the job API's train jobs and runs each
  reshard  rewrite a megatron-backend checkpoint for another tensor / pipeline / expert
           parallel layout (offline, one process)
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(HELP, end="")
        return 0
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
    if args[0] == "reshard":
        from trainer.backends.megatron.reshard import main as reshard

        return reshard(args[1:])
    from trainer.score import main as score

    return score(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
