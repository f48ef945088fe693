"""The options of ``swerl eval`` / ``python -m services.eval``, defined once for both.

``swerl eval`` (the base CLI) parses them to give its help and usage errors, then runs the
evaluation composer ``python -m services.eval`` in a child process with the same arguments: the
base imports no plane and no composer (docs/architecture.md), so the CLI only names the module.
"""

from __future__ import annotations

import argparse

from services.cli import positive_int, repo_timeout

EVAL_MODULE = "services.eval"

EVAL_DESCRIPTION = """\
Score SWE-bench predictions like the official harness's run_evaluation: every patch is applied
and tested in a fresh sandbox from its instance image (never pulled at run time), graded with
the harness's test spec and log parser (grading="swebench"), and the run report is written in
the harness's shape. See docs/eval.md.

outputs in --report-dir DIR:
  logs/run_evaluation/RUN_ID/MODEL/INSTANCE/   patch.diff, run_instance.log, test_output.txt,
                                                report.json (only when the tests ran),
                                                hardened.json, hardened.log
  MODEL.RUN_ID.json                             the run report (resolved/unresolved/error ids)
"""

EVAL_EPILOG = """\
examples:
  swerl eval --dataset tests/data/instances.jsonl --predictions gold --report-dir /tmp/ev \\
        --backend bwrap
  swerl eval --dataset swe-bench-verified.parquet --predictions preds.jsonl \\
        --report-dir runs/eval --image-namespace swebench --workers 8 --resume
  swerl eval --dataset swe-bench-verified.parquet --model /ckpt/step-200 \\
        --engine-url http://sglang-0:30000,http://sglang-1:30000 --report-dir runs/eval-200
  LLM_KEY=... swerl eval --dataset swe-bench-verified.parquet --model-url https://llm/v1 \
        --upstream-model some-model --api-key-env LLM_KEY --report-dir runs/eval-endpoint

exit status:
  0  the run report was written
  1  the report was written, but an instance hit an infrastructure failure (sandbox, image,
     timeout of a harness step): counted as an error, the resolved rate is a lower bound
  2  bad arguments, dataset or predictions file (the message names file, line and field), or
     the run directory exists without --resume
  130  interrupted"""


def _id_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of instance ids")
    return items


def _absolute_dir(text: str) -> str:
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"must be an absolute path, got {text!r}")
    return text


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of the evaluation script, each with its help."""
    p.add_argument("--dataset", required=True, metavar="FILE",
                   help="dataset file: SWE-bench (Verified) JSONL / JSON / parquet as published, "
                        "or the mini set tests/data/instances.jsonl")  # fmt: skip
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--predictions", metavar="FILE",
                        help="grade these SWE-bench predictions (.jsonl or .json; fields "
                             "instance_id, model_name_or_path, model_patch), or 'gold' for the "
                             "dataset's own patches")  # fmt: skip
    source.add_argument("--model", metavar="DIR",
                        help="generate the predictions first: the OpenHands agent of "
                             "training on this checkpoint (its tokenizer and chat template; "
                             "served by --engine-url, else by the CPU reference engine), "
                             "then grade")  # fmt: skip
    source.add_argument("--model-url", metavar="URL",
                        help="generate the predictions first with any OpenAI-compatible "
                             "endpoint (base URL up to /v1; --upstream-model names its model): "
                             "the same agent and limits, the adapter relaying and recording "
                             "text-only trajectories, then grade")  # fmt: skip
    p.add_argument("--report-dir", default="swerl-eval", metavar="DIR",
                   help="where logs and the run report go (default ./swerl-eval)")  # fmt: skip
    p.add_argument("--run-id", metavar="ID",
                   help="run id (default: the predictions file's name without suffix)")  # fmt: skip
    p.add_argument("--backend", choices=("docker", "bwrap"), default="docker",
                   help="sandbox backend (docker: the engine at $DOCKER_HOST; bwrap: the image "
                        "trees `python -m sandbox_worker.images build` registered)")  # fmt: skip
    p.add_argument("--state-root", type=_absolute_dir, metavar="DIR",
                   help="host directory of the sandboxes' state (default: the backend's own, "
                        "/var/lib/swerl/sandboxes for docker); in a container that drives the "
                        "host's engine it must be the same path inside and out")  # fmt: skip
    p.add_argument("--workers", type=positive_int, default=4, metavar="N",
                   help="instances graded at once, each in its own sandbox (4)")  # fmt: skip
    p.add_argument("--instances", type=_id_list, metavar="ID,ID,...",
                   help="only these instances of the dataset")  # fmt: skip
    p.add_argument("--max-instances", type=positive_int, metavar="N",
                   help="only the first N instances (after --instances and --deny)")  # fmt: skip
    p.add_argument("--deny", metavar="FILE",
                   help="instance deny-list (an id a line, '# reason'; services/datasets/"
                        "denylist.py): those instances are skipped, left out of the total and "
                        "listed as denied_ids in the run report")  # fmt: skip
    p.add_argument("--resume", action="store_true",
                   help="continue the run RUN_ID: instances with a report.json are not graded "
                        "again")  # fmt: skip
    p.add_argument("--timeout", type=positive_int, default=1800, metavar="S",
                   help="seconds the tests of one instance may run (1800)")  # fmt: skip
    p.add_argument("--repo-timeout", type=repo_timeout, action="append", default=[],
                   metavar="OWNER/NAME=S",
                   help="seconds the tests of one repository's instances may run, over "
                        "--timeout (repeatable, e.g. --repo-timeout sympy/sympy=3600; the "
                        "worker's evaluation.test_timeout_by_repo)")  # fmt: skip
    p.add_argument("--image-namespace", metavar="NS",
                   help="image namespace: 'swebench' for the official SWE-bench images (default "
                        "$SWERL_IMAGE_NAMESPACE or swerl, the images built here)")  # fmt: skip
    p.add_argument("--image-tag", default="latest", metavar="TAG",
                   help="image tag (latest)")  # fmt: skip
    p.add_argument("--eval-script", choices=("auto", "harness", "swerl"), default="auto",
                   help="test script: 'harness' = the official one for the row (its "
                        "eval_script, else the harness's spec for repo/version); 'swerl' = "
                        "swerl's pytest script (the mini set); 'auto' (default): harness "
                        "where it has a spec")  # fmt: skip
    p.add_argument("--no-hardened", dest="hardened", action="store_false",
                   help="skip the hardened pass: by default every prediction is graded a second "
                        "time as training rewards are graded (strict patches, test infrastructure "
                        "restored, structured report) and the run report adds hardened_resolved "
                        "and tamper flags next to the unchanged official verdict; the hardened "
                        "pass doubles evaluation time")  # fmt: skip
    g = p.add_argument_group("generation (with --model or --model-url)")
    g.add_argument("--engine-url", type=_id_list, metavar="URL,URL,...",
                   help="SGLang-protocol engines serving --model (default: start the reference "
                        "engine on CPU, for small models and tests)")  # fmt: skip
    g.add_argument("--engine-script", metavar="FILE",
                   help="test machinery: the reference engine replays this scripted policy "
                        "(sandbox_worker/tasks/scripted.py) instead of sampling")  # fmt: skip
    g.add_argument(
        "--upstream-model",
        metavar="NAME",
        help="--model-url: the model the endpoint is asked for (required there)",
    )
    g.add_argument("--api-key-env", metavar="VAR",
                   help="--model-url: environment variable holding the endpoint's API key "
                        "(the key is never on a command line or in a sandbox)")  # fmt: skip
    g.add_argument("--model-name", metavar="NAME",
                   help="model_name_or_path of the predictions (default: the --model "
                        "directory's name, or --upstream-model)")  # fmt: skip
    g.add_argument("--max-steps", type=positive_int, default=300, metavar="N",
                   help="agent steps (LLM calls) per instance, as in training (300)")  # fmt: skip
    g.add_argument("--wall-time", type=positive_int, default=3600, metavar="S",
                   help="seconds one agent run may take, as in training (3600)")  # fmt: skip
    g.add_argument("--max-context", type=positive_int, default=131072, metavar="TOKENS",
                   help="context window of the agent, as in training (131072)")  # fmt: skip
    g.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="sampling temperature (1.0, as in training)")  # fmt: skip
    g.add_argument("--generation-timeout", type=positive_int, default=86400, metavar="S",
                   help="seconds the whole generation may take before it is cancelled")  # fmt: skip


def build_eval_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=EVAL_DESCRIPTION, epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_eval_arguments(parser)
    return parser
