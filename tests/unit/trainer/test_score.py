"""``python -m trainer score``: per-token logprobs equal a plain forward pass of the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.engines import tiny_model_dir_fixture  # noqa: F401 (fixture)
from trainer.__main__ import main


def write_lines(path: Path, items: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return path


@pytest.mark.parametrize(
    "backend", ["torch", pytest.param("megatron", marks=pytest.mark.slow)]
)  # megatron-core's import takes seconds
def test_score_matches_a_full_forward(tiny_model_dir: Path, tmp_path: Path, backend: str) -> None:
    from transformers import AutoModelForCausalLM

    items = [
        {"input_ids": [3, 4, 5, 6, 7, 8, 9], "start": 2, "id": "a"},
        {"input_ids": [10, 11, 12], "start": 1},
    ]
    source = write_lines(tmp_path / "in.jsonl", items)
    assert main(["score", "--backend", backend, "--model", str(tiny_model_dir),
                 "--input", str(source), "--output", str(tmp_path / "out.jsonl")]) == 0  # fmt: skip
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for item, got in zip(items, out, strict=True):
        assert {k: got[k] for k in item} == item  # the input is repeated
        ids, start = item["input_ids"], item["start"]
        assert len(got["logprobs"]) == len(ids) - start
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        expected = [float(logp[t - 1, ids[t]]) for t in range(start, len(ids))]
        assert got["logprobs"] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "line 1: not JSON"),
        ({"input_ids": [1, 2], "start": 0}, "start must be an integer with 1 <= start"),
        ({"input_ids": [1, 2], "start": 2}, "len(input_ids)=2, got 2"),
        ({"input_ids": [1, "x"], "start": 1}, "input_ids must be a list of integers"),
        ({"input_ids": [1, 99999], "start": 1}, "token id 99999 outside the vocabulary"),
    ],
)
def test_bad_input_lines_are_named(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], line, needle: str
) -> None:
    source = write_lines(tmp_path / "in.jsonl", [line])
    code = main(["score", "--model", str(tiny_model_dir), "--input", str(source),
                 "--output", str(tmp_path / "out.jsonl")])  # fmt: skip
    assert code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.slow  # two processes importing megatron-core
@pytest.mark.parametrize("split", ["--pp", "--cp"])  # two stages; each sequence in two slices
def test_two_processes_score_like_a_full_forward(
    tiny_model_dir: Path, tmp_path: Path, split: str
) -> None:
    from transformers import AutoModelForCausalLM

    items = [
        {"input_ids": [3, 4, 5, 6, 7, 8, 9], "start": 2},
        {"input_ids": [10, 11, 12], "start": 1},
    ]
    source = write_lines(tmp_path / "in.jsonl", items)
    assert main(["score", "--backend", "megatron", split, "2", "--nproc", "2",
                 "--model", str(tiny_model_dir), "--input", str(source),
                 "--output", str(tmp_path / "out.jsonl")]) == 0  # fmt: skip
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(out) == len(items)  # rank 0 wrote every line once
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for item, got in zip(items, out, strict=True):
        ids, start = item["input_ids"], item["start"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        expected = [float(logp[t - 1, ids[t]]) for t in range(start, len(ids))]
        assert got["logprobs"] == pytest.approx(expected, abs=1e-5)


def test_parallel_flags_need_the_megatron_backend(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_lines(tmp_path / "in.jsonl", [{"input_ids": [1, 2], "start": 1}])
    code = main(["score", "--pp", "2", "--model", str(tiny_model_dir), "--input", str(source),
                 "--output", str(tmp_path / "out.jsonl")])  # fmt: skip
    assert code == 2
    assert "--tp/--pp/--ep/--cp/--nproc need --backend megatron" in capsys.readouterr().err
    code = main(["score", "--cp", "2", "--model", str(tiny_model_dir), "--input", str(source),
                 "--output", str(tmp_path / "out.jsonl")])  # fmt: skip
    assert code == 2 and "need --backend megatron" in capsys.readouterr().err
