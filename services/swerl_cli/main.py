"""The ``swerl`` command: argument parsing and the subcommands."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any

from services.datasets import DatasetError
from services.datasets.mixture import is_mixture_spec, parse_mixture
from services.swerl_cli.client import ApiClient
from services.swerl_cli.errors import (
    EXIT_CODES_HELP,
    EXIT_JOB_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
)
from services.swerl_cli.eval_options import (
    EVAL_DESCRIPTION,
    EVAL_EPILOG,
    EVAL_MODULE,
    add_eval_arguments,
)
from services.swerl_cli.jobfile import load_job_file
from services.swerl_cli.render import (
    detail,
    progress_bar,
    progress_line,
    table,
    trajectory_line,
)

DEFAULT_API = "http://127.0.0.1:8300"
RAW = argparse.RawDescriptionHelpFormatter
TERMINAL = ("succeeded", "failed", "cancelled")

DESCRIPTION = """\
swerl: submit and watch training, rollout and evaluation jobs of a swerl cluster.

The job subcommands talk to the job API (python -m services.api; docs/api.md) at --api
(or $SWERL_API_URL) with the bearer token --token (or $SWERL_API_TOKEN). `eval` runs locally
(python -m services.eval; docs/eval.md), and so do demo, images and validate: they run their
module on this machine with the arguments that follow (swerl demo --help shows the module's).

  submit   queue a job: swerl submit rollout|train|eval ...  or  swerl submit -f job.yaml
  status   list jobs, or show one (with --watch: a live progress bar and a line per
           trajectory whenever its turn, tokens or tool changes, until it ends)
  logs     a job's log lines and its trajectories' progress events (-f: follow until the
           job ends)
  results  a job's results as NDJSON, one trajectory per line (--follow)
  cancel   cancel a job (queued: at once; running: its runner stops it)
  eval     (local) grade SWE-bench predictions in fresh sandboxes, as the official harness
  demo     (local) a SWE rollout batch of the mini set through the whole stack
           (python -m services.demo; `make demo` also trains the toy task through the API)
  images   (local) build / pull / name task images (python -m sandbox_worker.images)
  validate (local) check a dataset's instances: gold resolves, empty does not
           (python -m sandbox_worker.validate)
"""

EPILOG = f"""\
examples:
  swerl submit rollout --instances django__django-1,astropy__astropy-2 --samples 4 --wait
  swerl submit train --model Qwen/Qwen3-8B --dataset swe-gym --steps 200 \\
        --checkpoint-dir /ckpt/run1 --idempotency-key run1
  swerl submit -f job.yaml
  swerl status                        # the newest jobs as a table
  swerl status rollout-20260101-ab12cd --watch
  swerl logs rollout-20260101-ab12cd -f
  swerl cancel rollout-20260101-ab12cd

{EXIT_CODES_HELP}
  (swerl eval has its own: swerl eval --help)
"""


def _csv(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _submit_options(p: argparse.ArgumentParser, default: Any = None) -> None:
    """Options of every submit form (before or after the kind); a kind's parser leaves unset
    ones alone (``SUPPRESS``) so that ``submit --wait rollout ...`` keeps its ``--wait``."""
    p.add_argument("--idempotency-key", default=default, metavar="KEY",
                   help="retry-safe: the same key returns the same job")  # fmt: skip
    p.add_argument("--wait", action="store_true", default=default or False,
                   help="show progress until the job ends (exit 6 if it failed or any "
                   "trajectory aborted)")  # fmt: skip
    _allow_failed_option(p, default)


def _allow_failed_option(p: argparse.ArgumentParser, default: Any = None) -> None:
    p.add_argument("--allow-failed-trajectories", action="store_true",
                   default=default or False,
                   help="with --wait/--watch: exit 0 when the job succeeded although some "
                   "trajectories aborted (infrastructure failures)")  # fmt: skip


def _submit_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "submit", help="queue a job", description="Queue a job (or -f FILE; see docs/api.md).",
        epilog="job file:\n  kind: rollout\n  spec:\n    instance_ids: [a, b]\n    n_samples: 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("-f", "--file", help="a YAML job file (kind: and spec:)")
    _submit_options(p)
    kinds = p.add_subparsers(dest="kind", metavar="KIND")
    t = kinds.add_parser(
        "train", help="a training run (run by a trainer service)", formatter_class=RAW,
        description="Queue a training run; a trainer of --group claims it (one at a time).",
        epilog="example:\n  swerl submit train --model Qwen/Qwen3-8B --dataset swe-gym "
        "--steps 200 --checkpoint-dir /ckpt/run1",
    )  # fmt: skip
    _submit_options(t, argparse.SUPPRESS)
    t.add_argument("--model", required=True, help="model name or path")
    t.add_argument("--dataset", required=True, type=_train_dataset,
                   help="dataset files drawn by weight, [name=]path[:weight],... "
                   "(.jsonl/.json/.parquet, read on the trainer's host; prompts are "
                   "<name>/<instance_id>), or a file of instance ids")  # fmt: skip
    t.add_argument("--steps", type=int, required=True, help="optimizer steps")
    t.add_argument("--checkpoint-dir", required=True, help="where checkpoints go")
    t.add_argument("--algorithm", default="li2sao", help="li2sao (default) or a baseline")
    t.add_argument("--prompts-per-step", type=int, default=8,
                   help="prompts (groups) per training batch (8)")  # fmt: skip
    t.add_argument("--samples-per-prompt", type=int, default=8,
                   help="trajectories per prompt in the group phase (8)")  # fmt: skip
    t.add_argument("--resume", action="store_true", help="resume from the checkpoint dir")
    t.add_argument("--group", default="default", help="trainer group that runs it")
    r = kinds.add_parser(
        "rollout", help="trajectories with rewards (instances x samples)", formatter_class=RAW,
        description="Queue a rollout: every instance x --samples trajectories, each graded;\n"
        "`swerl results JOB` gives their rewards.",
        epilog="example:\n"
        "  swerl submit rollout --instances django__django-11099 --samples 4 --wait",
    )  # fmt: skip
    _submit_options(r, argparse.SUPPRESS)
    r.add_argument("--instances", type=_csv, required=True, metavar="ID,ID,...",
                   help="instance ids of the task set")  # fmt: skip
    r.add_argument("--samples", type=int, default=1, metavar="N",
                   help="trajectories per instance (1)")  # fmt: skip
    r.add_argument("--model", help="model name (informational)")
    r.add_argument("--policy-version", type=int, default=0, metavar="V",
                   help="weights version the trajectories must be sampled with (0)")  # fmt: skip
    r.add_argument("--max-steps", type=int, metavar="N", help="agent steps per trajectory (300)")
    r.add_argument("--temperature", type=float, metavar="T", help="sampling temperature (1.0)")
    e = kinds.add_parser(
        "eval", help="score a checkpoint or predictions (pass@1)", formatter_class=RAW,
        description="Queue an evaluation on a dataset (pass@1, the resolved rate) for an "
        "evaluator service (python -m services.eval serve): a checkpoint (predictions are "
        "generated with the training scaffold, then graded) or a SWE-bench predictions file "
        "('gold': the dataset's own patches). Paths are read on the evaluator's host.",
    )  # fmt: skip
    _submit_options(e, argparse.SUPPRESS)
    source = e.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="checkpoint directory to evaluate")
    source.add_argument("--predictions", help="SWE-bench predictions file to grade, or 'gold'")
    e.add_argument("--dataset", required=True, help="dataset file (e.g. SWE-bench Verified)")
    e.add_argument("--instances", help="only these instances (comma-separated ids)")
    e.add_argument("--max-instances", type=int, help="evaluate only the first N instances")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swerl", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--api", default=os.environ.get("SWERL_API_URL", DEFAULT_API),
                        help=f"job API URL ($SWERL_API_URL, default {DEFAULT_API})")  # fmt: skip
    parser.add_argument("--token", default=os.environ.get("SWERL_API_TOKEN"),
                        help="bearer token ($SWERL_API_TOKEN)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _submit_parsers(sub)
    s = sub.add_parser("status", help="list jobs, or show one",
                       description="A table of jobs, or one job's state and progress.")  # fmt: skip
    s.add_argument("job", nargs="?", help="a job id (none: a table of jobs)")
    s.add_argument("--kind", choices=("train", "rollout", "eval"), help="only jobs of this kind")
    s.add_argument("--state", choices=("queued", "running", "cancelling", *TERMINAL),
                   help="only jobs in this state")  # fmt: skip
    s.add_argument("--limit", type=int, default=20, help="jobs in the table (20)")
    s.add_argument("-w", "--watch", action="store_true", help="live progress until it ends")
    _allow_failed_option(s)
    lg = sub.add_parser("logs", help="a job's log lines", description="Print a job's log lines.")
    lg.add_argument("job", help="a job id")
    lg.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    rs = sub.add_parser("results", help="a job's results as NDJSON",
                        description="Print a job's results, one JSON object per line.")  # fmt: skip
    rs.add_argument("job", help="a job id")
    rs.add_argument("--follow", action="store_true", help="stream until the job ends")
    c = sub.add_parser("cancel", help="cancel a job",
                       description="Cancel a job (its submitter or an admin token).")  # fmt: skip
    c.add_argument("job", help="a job id")
    ev = sub.add_parser("eval", help="(local) grade SWE-bench predictions; docs/eval.md",
                        description=EVAL_DESCRIPTION, epilog=EVAL_EPILOG,
                        formatter_class=RAW)  # fmt: skip
    add_eval_arguments(ev)
    for name, (module, summary) in PASSTHROUGH.items():  # their module parses the rest
        sub.add_parser(name, help=f"(local) {summary}; python -m {module}", add_help=False,
                       description=f"Runs python -m {module} here with the arguments that "
                       f"follow: {summary} (its --help lists them).")  # fmt: skip
    return parser


def _train_dataset(value: str) -> str:
    """``--dataset`` of a training run: a mixture's syntax is checked here (exit 2)."""
    if is_mixture_spec(value):
        try:
            parse_mixture(value, check_files=False)
        except DatasetError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def spec_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if args.file:
        if args.kind:
            raise CliError(EXIT_USAGE, "give either -f FILE or a job kind, not both")
        return load_job_file(args.file)
    if args.kind == "train":
        batch = {"prompts_per_step": args.prompts_per_step,
                 "samples_per_prompt": args.samples_per_prompt}  # fmt: skip
        spec = {"algorithm": args.algorithm, "model": args.model, "dataset": args.dataset,
                "steps": args.steps, "checkpoint_dir": args.checkpoint_dir, "batch": batch,
                "resume": args.resume, "trainer_group": args.group}  # fmt: skip
        return "train", spec
    if args.kind == "rollout":
        spec = {"instance_ids": args.instances, "n_samples": args.samples,
                "policy_version": args.policy_version}  # fmt: skip
        if args.model:
            spec["model"] = args.model
        if args.max_steps is not None:
            spec["limits"] = {"max_steps": args.max_steps}
        if args.temperature is not None:
            spec["sampling"] = {"temperature": args.temperature}
        return "rollout", spec
    if args.kind == "eval":
        spec = {"dataset": args.dataset}
        if args.checkpoint is not None:
            spec["checkpoint"] = args.checkpoint
        if args.predictions is not None:
            spec["predictions"] = args.predictions
        if args.instances:
            spec["instance_ids"] = [x.strip() for x in args.instances.split(",") if x.strip()]
        if args.max_instances is not None:
            spec["max_instances"] = args.max_instances
        return "eval", spec
    raise CliError(EXIT_USAGE, "say what to submit: swerl submit train|rollout|eval ... or -f FILE")


def job_progress(api: ApiClient, job_id: str, after: str | None = None) -> dict[str, Any] | None:
    """The job's progress page (``GET /v1/jobs/{id}/progress``), or None from an API that has
    no progress events (an older one: 404 for a job that exists)."""
    params = {} if after is None else {"after": after}
    try:
        page: dict[str, Any] = api._call("GET", f"/v1/jobs/{job_id}/progress", params=params).json()
        return page
    except CliError as exc:
        if exc.code == EXIT_NOT_FOUND:
            return None
        raise


def _has_progress(job: dict[str, Any]) -> bool:
    """Whether a job has running trajectories to show: a rollout job being run."""
    return job["kind"] == "rollout" and job["state"] in ("running", "cancelling")


def progress_news(api: ApiClient, job: dict[str, Any], seen: dict[str, float]) -> list[str]:
    """A line for each trajectory of a rollout job whose latest event is newer than the one in
    ``seen`` (which is updated): what ``--watch`` prints under the bar."""
    if not _has_progress(job):
        return []
    page = job_progress(api, job["id"]) or {"latest": []}
    lines = []
    for event in page["latest"]:
        if seen.get(event["trajectory_id"]) != event["ts"]:
            seen[event["trajectory_id"]] = event["ts"]
            lines.append(progress_line(event))
    return lines


def watch(
    api: ApiClient, job_id: str, poll_s: float = 1.0, allow_failed_trajectories: bool = False
) -> int:
    """Show the job's progress until it ends, with a line per trajectory whenever its progress
    event changes; the exit status says how it ended."""
    live = sys.stdout.isatty()
    last = ""
    seen: dict[str, float] = {}
    while True:
        job = api.job(job_id)
        line = progress_bar(job)
        for news in progress_news(api, job, seen):
            print(("\r\033[K  " if live else "  ") + news, flush=True)
            last = ""  # the bar again, under the news
        if line != last:
            print(("\r" + line) if live else line, end="" if live else "\n", flush=True)
            last = line
        if job["state"] in TERMINAL:
            if live:
                print()
            if job.get("message"):
                print(job["message"])
            return ended(job, allow_failed_trajectories)
        time.sleep(poll_s)


def ended(job: dict[str, Any], allow_failed_trajectories: bool = False) -> int:
    """The exit status of a finished job (printing its trajectory counts): 6 unless it
    succeeded with no aborted trajectory, or ``allow_failed_trajectories`` forgives those."""
    line = trajectory_line(job)
    if line:
        print(line)
    if job["state"] != "succeeded":
        return EXIT_JOB_FAILED
    aborted = int((job.get("trajectories") or {}).get("aborted") or 0)
    if aborted and not allow_failed_trajectories:
        print(f"swerl: {aborted} trajectories failed (infrastructure aborts; their reasons are "
              "in the message above and in `swerl results`): exit 6; "
              "--allow-failed-trajectories accepts them", file=sys.stderr)  # fmt: skip
        return EXIT_JOB_FAILED
    return EXIT_OK


def cmd_submit(api: ApiClient, args: argparse.Namespace) -> int:
    kind, spec = spec_from_args(args)
    job = api.submit(kind, spec, args.idempotency_key)
    print(json.dumps(job, indent=2) if args.json else f"{job['id']} {job['state']}")
    for warning in job.get("warnings") or ():
        print(f"swerl: warning: {warning}", file=sys.stderr)
    if not args.wait:
        return EXIT_OK
    return watch(api, job["id"], allow_failed_trajectories=args.allow_failed_trajectories)


def cmd_status(api: ApiClient, args: argparse.Namespace) -> int:
    if args.job is None:
        if args.watch:
            raise CliError(EXIT_USAGE, "--watch needs a job id")
        jobs = api.jobs(args.kind, args.state, args.limit)
        print(json.dumps(jobs, indent=2) if args.json else table(jobs))
        return EXIT_OK
    if args.watch:
        return watch(api, args.job, allow_failed_trajectories=args.allow_failed_trajectories)
    job = api.job(args.job)
    if args.json:
        print(json.dumps(job, indent=2))
        return EXIT_OK
    print(detail(job))
    running = [e for e in _latest(api, job) if e["phase"] != "done"]
    for i, event in enumerate(running):
        print(f"{'running' if i == 0 else '':<11}{progress_line(event)}")
    return EXIT_OK


def _latest(api: ApiClient, job: dict[str, Any]) -> list[dict[str, Any]]:
    if not _has_progress(job):
        return []
    return (job_progress(api, job["id"]) or {"latest": []})["latest"]


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def log_and_progress(
    api: ApiClient, job_id: str, offset: int, after: str | None
) -> tuple[list[str], int, str | None]:
    """The job's log lines from ``offset`` and its progress events after ``after`` (None: the
    API has none), merged by time; returns (lines, next offset, next after)."""
    lines, offset_next = api.logs(job_id, offset)
    rows = [(line["ts"], f"{line['level']:<7} {line['message']}") for line in lines]
    if after is not None:
        page = job_progress(api, job_id, after)
        if page is None:
            after = None
        else:
            after = page["next_after"]
            rows += [(e["ts"], f"{'PROGRESS':<7} {progress_line(e)}") for e in page["events"]]
    rows.sort(key=lambda row: row[0])
    return [f"{_stamp(ts)} {text}" for ts, text in rows], offset_next, after


def cmd_logs(api: ApiClient, args: argparse.Namespace, poll_s: float = 1.0) -> int:
    offset, after = 0, "0"
    while True:
        lines, offset, after = log_and_progress(api, args.job, offset, after)
        for line in lines:
            print(line, flush=True)
        if not args.follow:
            return EXIT_OK
        if not lines:
            if api.job(args.job)["state"] in TERMINAL:
                lines, _, _ = log_and_progress(api, args.job, offset, after)
                if not lines:
                    return EXIT_OK
                continue
            time.sleep(poll_s)


def cmd_results(api: ApiClient, args: argparse.Namespace) -> int:
    """Print the results as they come; a reader that stops early (``| head``) closes the stream
    (:func:`main` turns its ``BrokenPipeError`` into a quiet exit 0)."""
    with closing(api.results(args.job, args.follow)) as lines:
        for line in lines:
            print(line, flush=True)
    return EXIT_OK


def cmd_cancel(api: ApiClient, args: argparse.Namespace) -> int:
    job = api.cancel(args.job)
    print(json.dumps(job, indent=2) if args.json else f"{job['id']} {job['state']}")
    return EXIT_OK


COMMANDS: dict[str, Callable[[ApiClient, argparse.Namespace], int]] = {
    "submit": cmd_submit,
    "status": cmd_status,
    "logs": cmd_logs,
    "results": cmd_results,
    "cancel": cmd_cancel,
}


def run_local(module: str, argv: Sequence[str], command: str) -> int:
    """Run a local tool's module in a child process with the arguments after ``command`` (the
    base CLI names the composer's module, it never imports it); its exit status is ours."""
    rest = list(argv)[list(argv).index(command) + 1 :]
    try:
        return subprocess.run([sys.executable, "-m", module, *rest], check=False).returncode
    except KeyboardInterrupt:
        return 130


LOCAL_COMMANDS = {"eval": EVAL_MODULE}
# Local commands whose module parses every argument after the command (--help included).
PASSTHROUGH = {
    "demo": ("services.demo", "a SWE rollout batch of the mini set through the whole stack"),
    "images": ("sandbox_worker.images", "build, pull or name task images"),
    "validate": ("sandbox_worker.validate", "check a dataset's instances in sandboxes"),
}


def _silence_stdout() -> None:
    """stdout's reader is gone: point file descriptor 1 at /dev/null, so the interpreter's last
    flush of what is still buffered does not fail a second time ("Exception ignored ...
    BrokenPipeError", exit 120; the recipe of Python's signal docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # not a file descriptor (an in-process caller)
        pass
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)  # argument errors: usage + exit 2
    if args.command in PASSTHROUGH:
        return run_local(PASSTHROUGH[args.command][0], argv, args.command)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in LOCAL_COMMANDS:
        return run_local(LOCAL_COMMANDS[args.command], argv, args.command)
    api = ApiClient(args.api, args.token)
    try:
        code = COMMANDS[args.command](api, args)
        sys.stdout.flush()  # a reader that left early fails here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # `swerl results JOB | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_OK
    except CliError as exc:
        print(f"swerl: error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    finally:
        api.close()
