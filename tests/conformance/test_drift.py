"""Drift guard: the SGLang surface swerl depends on (routes, request structures, answer keys)
against the committed snapshot of SGLang 0.5.23, and swerl's own wire models against what
SGLang knows.

A failure names each difference. A deliberate SGLang bump regenerates the snapshot with
``.venv/bin/python -m tests.conformance.surface --update`` (docs/sglang-conformance.md)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from services.protocol import sglang as protocol
from tests.conformance.conftest import EngineFactory
from tests.conformance.sglang_app import run
from tests.conformance.surface import (
    FACTORY,
    REQUIRED,
    ROUTE_BODY,
    SNAPSHOT,
    current_surface,
    surface_differences,
)
from tests.support.paths import REPO_ROOT

CLIENT = REPO_ROOT / "adapter" / "engines" / "sglang.py"

# swerl's wire models (services/protocol/sglang.py) -> the SGLang structure they stand for.
COUNTERPARTS: dict[str, str] = {
    "SamplingParams": "SamplingParams",
    "GenerateRequest": "GenerateReqInput",
    "UpdateWeightsFromDiskRequest": "UpdateWeightFromDiskReqInput",
    "GetWeightsByNameRequest": "GetWeightsByNameReqInput",
    "InitWeightsUpdateGroupRequest": "InitWeightsUpdateGroupReqInput",
    "UpdateWeightsFromDistributedRequest": "UpdateWeightsFromDistributedReqInput",
    "PauseGenerationRequest": "PauseGenerationReqInput",
    "AbortRequest": "AbortReq",
}
# Defaults of swerl's SamplingParams (to_wire leaves a field at its default out of the request,
# so SGLang's default applies) that differ from SGLang's in spelling only.
SAME_MEANING = {("SamplingParams", "top_k"): "-1 and 1 << 30 both disable top-k"}
# meta_info fields swerl's MetaInfo declares that SGLang never sends (reference engine only).
NOT_FROM_SGLANG = {"scripted"}


@pytest.fixture(scope="module")
def snapshot() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SNAPSHOT.read_text())
    return data


def test_installed_sglang_matches_the_snapshot(
    engine: EngineFactory, snapshot: dict[str, Any]
) -> None:
    async def scenario() -> dict[str, Any]:
        async with engine(max_running_requests=1, step_delay_s=0.01) as e:
            return await current_surface(e)

    current = run(scenario())
    problems = surface_differences(snapshot, current)
    assert not problems, (
        "SGLang's surface differs from tests/conformance/data/sglang_surface.json "
        "(a deliberate bump: python -m tests.conformance.surface --update):\n" + "\n".join(problems)
    )


def test_the_comparison_names_every_kind_of_difference(snapshot: dict[str, Any]) -> None:
    changed = json.loads(json.dumps(snapshot))
    changed["routes"].remove("POST /begin_weight_update")
    fields = changed["structures"]["UpdateWeightsFromDistributedReqInput"]
    fields["bucket_names"] = fields.pop("names")
    fields["flush_cache"] = False
    changed["meta_info"]["queued_abort"].append("prompt_tokens")
    problems = surface_differences(snapshot, changed)
    assert problems == [
        "route POST /begin_weight_update: gone",
        "UpdateWeightsFromDistributedReqInput.names: removed (renamed to one of ['bucket_names']?)",
        "UpdateWeightsFromDistributedReqInput.bucket_names: added (default '<required>')",
        "UpdateWeightsFromDistributedReqInput.flush_cache: default changed from True to False",
        "meta_info[queued_abort]: key 'prompt_tokens' new",
    ]


@pytest.mark.parametrize("ours", sorted(COUNTERPARTS))
def test_swerl_wire_models_use_fields_sglang_knows(ours: str, snapshot: dict[str, Any]) -> None:
    model: type[BaseModel] = getattr(protocol, ours)
    theirs = COUNTERPARTS[ours]
    fields = snapshot["structures"][theirs]
    unknown = sorted(set(model.model_fields) - set(fields))
    assert not unknown, f"{ours} has fields SGLang's {theirs} does not know: {unknown}"
    if ours != "SamplingParams":
        return
    for name, info in model.model_fields.items():
        sglang_default = fields[name]
        if sglang_default in (REQUIRED, FACTORY) or (ours, name) in SAME_MEANING:
            continue
        assert info.default == sglang_default, (
            f"{ours}.{name}: swerl's default {info.default!r} is left out of requests, "
            f"SGLang's default is {sglang_default!r}"
        )


def client_bodies(path: Path = CLIENT) -> dict[str, set[str]]:
    """The JSON keys each SGLangClient method sends, by the route it calls: string keys of
    dict literals and of ``body[...] =`` assignments in a method naming one route."""
    tree = ast.parse(path.read_text())
    bodies: dict[str, set[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SGLangClient"):
        for fn in (n for n in cls.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)):
            routes = {
                node.value
                for node in ast.walk(fn)
                if isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in ROUTE_BODY
            }
            keys: set[str] = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Dict):
                    keys |= {
                        k.value
                        for k in node.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    }
                if (
                    isinstance(node, ast.Subscript)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "body"
                    and isinstance(node.slice, ast.Constant)
                ):
                    keys.add(node.slice.value)
            if len(routes) == 1 and keys:
                bodies.setdefault(routes.pop(), set()).update(keys)
    return bodies


def test_client_request_bodies_use_fields_sglang_knows(snapshot: dict[str, Any]) -> None:
    bodies = client_bodies()
    assert "/generate" in bodies and "/update_weights_from_distributed" in bodies, bodies
    problems = []
    for route, keys in sorted(bodies.items()):
        structure = ROUTE_BODY[route]
        assert structure is not None
        unknown = sorted(keys - set(snapshot["structures"][structure]))
        if unknown:
            problems.append(f"{route}: {unknown} not fields of SGLang's {structure}")
    assert not problems, "\n".join(problems)


def test_answer_fields_swerl_reads_are_sent_by_sglang(snapshot: dict[str, Any]) -> None:
    meta = snapshot["meta_info"]
    reads = set(protocol.MetaInfo.model_fields) - NOT_FROM_SGLANG
    missing = sorted(reads - set(meta["finished_with_logprobs"]))
    assert not missing, f"swerl's MetaInfo reads {missing}, SGLang's answers lack them"
    required = {n for n, f in protocol.MetaInfo.model_fields.items() if f.is_required()}
    missing = sorted(required - set(meta["queued_abort"]))
    assert not missing, (
        f"an answer to a call aborted while queued lacks {missing}, which swerl's MetaInfo "
        "requires: the client would take it for a protocol error"
    )
    missing = sorted(set(protocol.ModelInfo.model_fields) - set(snapshot["model_info"]))
    assert not missing, f"swerl's ModelInfo reads {missing}, SGLang's /model_info lacks them"
