"""Contamination check between a training mixture and an evaluation set (SWE-bench Verified).

``python -m services.datasets.overlap --train gym=swe-gym.parquet,smith=swe-smith.jsonl
--eval swe-bench-verified.parquet`` reports, for every training instance:

* **same instance**: its ``instance_id`` is an evaluation id (the task itself leaked);
* **same snapshot**: same ``repo`` and ``base_commit`` as an evaluation instance (the agent
  trains on the exact tree it is later evaluated on);
* **near-duplicate problem**: the word 3-gram Jaccard similarity of the two problem statements
  (lower-cased, alphanumeric words; texts of fewer than 3 words compare as word sets) is at
  least ``--threshold`` (default 0.6); identical texts score 1;

and, as information (not a failure: SWE-smith shares repositories with SWE-bench by design),
the **shared repositories** with their instance counts on each side.

Exit status 0 when nothing but shared repositories was found, 1 when a training instance
overlaps an evaluation one, 2 for bad arguments or unreadable files. ``--deny-out FILE`` writes
the overlapping training ids as a deny-list (``services/datasets/denylist.py``) with the reason
on each line, to exclude them from training.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from services.datasets.loader import DatasetError, load_instances
from services.datasets.mixture import MixtureEntry, load_mixture, mixture_argument
from services.protocol.instance import SWEInstance

DEFAULT_THRESHOLD = 0.6
SHINGLE = 3
_WORD = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True)
class Overlap:
    """One training instance that overlaps an evaluation instance, and how."""

    train_key: str  # <dataset>/<instance_id>
    train_id: str
    eval_id: str
    kind: str  # "same instance" | "same snapshot" | "near-duplicate problem"
    similarity: float  # problem-statement similarity (1.0 for identical texts)


@dataclass(frozen=True)
class OverlapReport:
    overlaps: tuple[Overlap, ...]
    shared_repos: dict[str, tuple[int, int]]  # repo -> (training count, evaluation count)


def shingles(text: str) -> frozenset[tuple[str, ...]]:
    """The word 3-grams of ``text`` (its word set when it has fewer than 3 words)."""
    words = _WORD.findall(text.lower())
    if len(words) < SHINGLE:
        return frozenset((word,) for word in words)
    return frozenset(tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1))


def jaccard(a: frozenset[tuple[str, ...]], b: frozenset[tuple[str, ...]]) -> float:
    """|a & b| / |a | b|; two empty texts are not similar (0)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def find_overlaps(
    train: Iterable[MixtureEntry], evaluation: Sequence[SWEInstance], threshold: float
) -> OverlapReport:
    """Every overlap of ``train`` with ``evaluation`` (an inverted shingle index, so the cost is
    the shared shingles, not every pair)."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    eval_ids = {inst.instance_id for inst in evaluation}
    snapshots = {(inst.repo, inst.base_commit): pos for pos, inst in enumerate(evaluation)}
    eval_sets = [shingles(inst.problem_statement) for inst in evaluation]
    index: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for pos, grams in enumerate(eval_sets):
        for gram in grams:
            index[gram].append(pos)
    found: list[Overlap] = []
    train_repos: Counter[str] = Counter()
    for entry in train:
        inst = entry.instance
        train_repos[inst.repo] += 1
        grams = shingles(inst.problem_statement)
        if inst.instance_id in eval_ids:
            found.append(Overlap(entry.key, inst.instance_id, inst.instance_id, "same instance", 1))
        same = snapshots.get((inst.repo, inst.base_commit)) if inst.base_commit else None
        if same is not None:
            sim = jaccard(grams, eval_sets[same])
            other = evaluation[same].instance_id
            found.append(Overlap(entry.key, inst.instance_id, other, "same snapshot", sim))
        shared = Counter(pos for gram in grams for pos in index.get(gram, ()))
        for pos, count in shared.items():
            sim = count / (len(grams) + len(eval_sets[pos]) - count)
            if sim >= threshold:
                other = evaluation[pos].instance_id
                found.append(
                    Overlap(entry.key, inst.instance_id, other, "near-duplicate problem", sim)
                )
    eval_repos = Counter(inst.repo for inst in evaluation)
    shared_repos = {r: (train_repos[r], eval_repos[r]) for r in sorted(train_repos & eval_repos)}
    return OverlapReport(tuple(found), shared_repos)


def format_report(report: OverlapReport) -> str:
    lines = [f"{len(report.overlaps)} overlap(s) of training instances with the evaluation set"]
    for o in report.overlaps:
        lines.append(f"  {o.train_key} ~ {o.eval_id}: {o.kind} (similarity {o.similarity:.2f})")
    lines.append(f"{len(report.shared_repos)} shared repositories (training, evaluation count):")
    lines += [f"  {repo}: {t}, {e}" for repo, (t, e) in report.shared_repos.items()]
    return "\n".join(lines)


def denylist_text(report: OverlapReport) -> str:
    """The overlapping training ids as a deny-list, one line each with the first reason."""
    first: dict[str, Overlap] = {}
    for o in report.overlaps:
        first.setdefault(o.train_id, o)
    return "".join(f"{iid}  # {o.kind} of {o.eval_id}\n" for iid, o in first.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.datasets.overlap",
        description="Contamination check: training instances that are, share the snapshot of, "
        "or near-duplicate the problem of an evaluation instance; plus shared repositories.",
    )
    parser.add_argument(
        "--train",
        type=mixture_argument,
        required=True,
        help="training mixture, [name=]path[:weight],... (as --dataset)",
    )
    parser.add_argument(
        "--eval", type=Path, required=True, help="evaluation dataset file (e.g. Verified)"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"problem-statement similarity counted as a near duplicate ({DEFAULT_THRESHOLD})",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON")
    parser.add_argument(
        "--deny-out", type=Path, default=None, help="write the overlapping ids as a deny-list"
    )
    args = parser.parse_args(argv)
    if not 0 < args.threshold <= 1:
        parser.error(f"--threshold must be in (0, 1], got {args.threshold}")
    try:
        train = [e for entries in load_mixture(args.train).values() for e in entries]
        evaluation = load_instances(args.eval)
    except DatasetError as exc:
        parser.exit(2, f"error: {exc}\n")
    report = find_overlaps(train, evaluation, args.threshold)
    print(format_report(report))
    if args.json is not None:
        data = {"overlaps": [asdict(o) for o in report.overlaps], "shared_repos": {}}
        data["shared_repos"] = {r: list(c) for r, c in report.shared_repos.items()}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    if args.deny_out is not None:
        args.deny_out.write_text(denylist_text(report))
    return 1 if report.overlaps else 0


if __name__ == "__main__":
    sys.exit(main())
