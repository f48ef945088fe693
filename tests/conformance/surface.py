"""The part of SGLang's HTTP surface that swerl uses, as data: routes, request structures with
their fields and defaults, and the ``meta_info`` keys of ``/generate`` answers.

``tests/conformance/test_drift.py`` compares the installed SGLang with the committed snapshot
``tests/conformance/data/sglang_surface.json``. On a deliberate SGLang bump, regenerate it
(docs/sglang-conformance.md, "Bumping SGLang")::

    .venv/bin/python -m tests.conformance.surface --update

and review the diff of the JSON file: every changed line is a change of SGLang's contract.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec

SNAPSHOT = Path(__file__).parent / "data" / "sglang_surface.json"

# (method, path) of every SGLang route swerl calls (adapter/engines/sglang.py).
ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/generate"),
    ("POST", "/update_weights_from_disk"),
    ("POST", "/init_weights_update_group"),
    ("POST", "/destroy_weights_update_group"),
    ("POST", "/begin_weight_update"),
    ("POST", "/update_weights_from_distributed"),
    ("POST", "/end_weight_update"),
    ("POST", "/pause_generation"),
    ("POST", "/continue_generation"),
    ("POST", "/abort_request"),
    ("POST", "/flush_cache"),
    ("POST", "/get_weights_by_name"),
    ("GET", "/model_info"),
    ("GET", "/server_info"),
    ("GET", "/get_server_info"),
    ("GET", "/health"),
)

# The request body each route parses, by SGLang's class name (None: no body swerl sends).
ROUTE_BODY: dict[str, str | None] = {
    "/generate": "GenerateReqInput",
    "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "/begin_weight_update": "BeginWeightUpdateReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/end_weight_update": "EndWeightUpdateReqInput",
    "/pause_generation": "PauseGenerationReqInput",
    "/continue_generation": "ContinueGenerationReqInput",
    "/abort_request": "AbortReq",
    "/get_weights_by_name": "GetWeightsByNameReqInput",
}

# SGLang's structures swerl sends or reads (io_struct, plus SamplingParams).
STRUCTURES: tuple[str, ...] = (
    "GenerateReqInput",
    "SamplingParams",
    "UpdateWeightFromDiskReqInput",
    "InitWeightsUpdateGroupReqInput",
    "UpdateWeightsFromDistributedReqInput",
    "BeginWeightUpdateReqInput",
    "EndWeightUpdateReqInput",
    "DestroyWeightsUpdateGroupReqInput",
    "PauseGenerationReqInput",
    "ContinueGenerationReqInput",
    "AbortReq",
    "GetWeightsByNameReqInput",
)

REQUIRED = "<required>"
FACTORY = "<factory>"


def _default(value: Any) -> Any:
    """A field default as JSON (its repr when it is not plain data)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def structure_fields(cls: type) -> dict[str, Any]:
    """``{field: default}`` of a dataclass or msgspec struct (REQUIRED / FACTORY markers)."""
    fields: dict[str, Any] = {}
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        for field in msgspec.structs.fields(cls):
            if field.default is not msgspec.NODEFAULT:
                fields[field.name] = _default(field.default)
            elif field.default_factory is not msgspec.NODEFAULT:
                fields[field.name] = FACTORY
            else:
                fields[field.name] = REQUIRED
        return fields
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            fields[field.name] = _default(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            fields[field.name] = FACTORY
        else:
            fields[field.name] = REQUIRED
    return fields


def structure_class(sg: SimpleNamespace, name: str) -> type:
    if name == "SamplingParams":
        from sglang.srt.sampling.sampling_params import SamplingParams

        return SamplingParams
    cls: type = getattr(sg.io, name)
    return cls


def app_routes(sg: SimpleNamespace) -> set[tuple[str, str]]:
    routes: set[tuple[str, str]] = set()
    for route in sg.app.routes:
        for method in getattr(route, "methods", None) or ():
            routes.add((method, route.path))
    return routes


async def meta_info_keys(engine: Any) -> dict[str, list[str]]:
    """The ``meta_info`` keys of SGLang's answers: a finished call, one with logprobs and top
    logprobs, and one aborted while queued (``TokenizerManager._handle_abort_req``)."""
    http = engine.http
    base = {"input_ids": [5, 17, 42, 99], "stream": False}
    plain = await http.post(
        "/generate", json={**base, "sampling_params": {"max_new_tokens": 2}, "rid": "plain"}
    )
    logprobs = await http.post(
        "/generate",
        json={
            **base,
            "sampling_params": {"max_new_tokens": 2},
            "return_logprob": True,
            "top_logprobs_num": 2,
            "rid": "logprobs",
        },
    )
    long = {"max_new_tokens": 10_000, "ignore_eos": True}
    running = asyncio.create_task(
        http.post("/generate", json={**base, "sampling_params": long, "rid": "running"})
    )
    queued = asyncio.create_task(
        http.post("/generate", json={**base, "sampling_params": long, "rid": "queued"})
    )
    await engine.wait_until(running=1, waiting=1)
    await http.post("/abort_request", json={"abort_all": True})
    aborted = (await queued).json()
    await running
    return {
        "finished": sorted(plain.json()["meta_info"]),
        "finished_with_logprobs": sorted(logprobs.json()["meta_info"]),
        "queued_abort": sorted(aborted["meta_info"]),
    }


async def model_info_keys(engine: Any) -> list[str]:
    return sorted((await engine.http.get("/model_info")).json())


async def current_surface(engine: Any) -> dict[str, Any]:
    """The installed SGLang's surface (``engine``: a running SGLangEngine, max 1 running)."""
    sg = engine.sg
    routes = app_routes(sg)
    return {
        "sglang": sg.version,
        "routes": sorted(f"{m} {p}" for m, p in ROUTES if (m, p) in routes),
        "structures": {name: structure_fields(structure_class(sg, name)) for name in STRUCTURES},
        "meta_info": await meta_info_keys(engine),
        "model_info": await model_info_keys(engine),
    }


def surface_differences(snapshot: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Every difference, one line each: routes gone or new, fields added, removed (a rename
    shows as both), defaults changed, meta_info / model_info keys gone or new."""
    problems: list[str] = []
    if snapshot.get("sglang") != current.get("sglang"):
        problems.append(
            f"SGLang version: snapshot {snapshot.get('sglang')}, installed {current.get('sglang')}"
        )
    for route in sorted(set(snapshot["routes"]) - set(current["routes"])):
        problems.append(f"route {route}: gone")
    for route in sorted(set(current["routes"]) - set(snapshot["routes"])):
        problems.append(f"route {route}: new (not in the snapshot)")
    for name in sorted(set(snapshot["structures"]) | set(current["structures"])):
        old = snapshot["structures"].get(name)
        new = current["structures"].get(name)
        if old is None or new is None:
            problems.append(f"{name}: {'gone' if new is None else 'not in the snapshot'}")
            continue
        removed = sorted(set(old) - set(new))
        added = sorted(set(new) - set(old))
        for field in removed:
            hint = f" (renamed to one of {added}?)" if added else ""
            problems.append(f"{name}.{field}: removed{hint}")
        for field in added:
            problems.append(f"{name}.{field}: added (default {new[field]!r})")
        for field in sorted(set(old) & set(new)):
            if old[field] != new[field]:
                problems.append(
                    f"{name}.{field}: default changed from {old[field]!r} to {new[field]!r}"
                )
    for section in ("meta_info", "model_info"):
        old_keys, new_keys = snapshot[section], current[section]
        if section == "model_info":
            old_keys, new_keys = {"": old_keys}, {"": new_keys}
        for kind in sorted(set(old_keys) | set(new_keys)):
            where = f"{section}[{kind}]" if kind else section
            before, after = set(old_keys.get(kind, [])), set(new_keys.get(kind, []))
            problems += [f"{where}: key {k!r} gone" for k in sorted(before - after)]
            problems += [f"{where}: key {k!r} new" for k in sorted(after - before)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.surface")
    parser.add_argument("--update", action="store_true", help=f"rewrite {SNAPSHOT}")
    args = parser.parse_args(argv)

    from tests.conformance.sglang_app import EngineOptions, SGLangEngine, run
    from tests.support.engines import tiny_model_path

    async def collect(model_dir: Path) -> dict[str, Any]:
        options = EngineOptions(model_dir=model_dir, max_running_requests=1, step_delay_s=0.01)
        async with SGLangEngine(options) as engine:
            return await current_surface(engine)

    with tempfile.TemporaryDirectory() as tmp:
        current = run(collect(tiny_model_path(Path(tmp))))
    if args.update:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        print(f"wrote {SNAPSHOT}")
        return 0
    problems = surface_differences(json.loads(SNAPSHOT.read_text()), current)
    print("\n".join(problems) or "no differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
