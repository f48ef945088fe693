"""Disk transport (issue 11): trainer -> v<N>/ export -> adapter /admin/weights -> engine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import torch

from tests.integration.adapter.conftest import ADMIN_TOKEN, AdapterFactory
from tests.support.engines import reference_server_in_thread
from tests.support.publish import (
    max_gap,
    move_weights,
    recomputed,
    served,
    trainer,
)
from trainer.publish import DiskPublisher, PublishConfig, PublishError, make_publisher
from trainer.publish.base import logprob_probe
from trainer.publish.versions import directory_probes, export_version


def config(url: str, weights_dir: Path, keep: int) -> PublishConfig:
    return PublishConfig(
        adapter_url=url, admin_token=ADMIN_TOKEN, weights_dir=str(weights_dir), keep_last=keep
    )


def test_published_versions_are_served_and_old_ones_pruned(
    adapter: AdapterFactory, model_dir: Path, tmp_path: Path
) -> None:
    backend = trainer(model_dir)
    weights = tmp_path / "weights"
    with (
        reference_server_in_thread(model_dir, weight_version="0") as engine,
        adapter(engines=[engine.url]) as a,
    ):
        publisher = make_publisher(config(a.url, weights, keep=2))
        assert isinstance(publisher, DiskPublisher)
        _, before, _ = served(engine.url)
        for step in (1, 2, 3):
            move_weights(backend, seed=step)
            result = publisher.publish(backend)
            assert result is not None and result.version == step
            output, logprobs, version = served(engine.url)
            assert version == str(step)
            assert max_gap(logprobs, recomputed(backend, output)) < 1e-5
            manifest = json.loads((weights / f"v{step}" / "manifest.json").read_text())
            assert manifest["version"] == step
            assert any(name.endswith(".safetensors") for name in manifest["files"])
            assert result.timings["export"] > 0 and result.timings["engine_load"] > 0
        assert (
            a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()["current_version"] == 3
        )
        assert sorted(p.name for p in weights.iterdir()) == ["v2", "v3"]
        assert [Path(p).name for p in result.pruned] == ["v1"]
        assert before  # the engine served the initial weights before the first publish
        publisher.close()


def test_a_refused_publish_keeps_the_previous_version_serving(
    adapter: AdapterFactory, model_dir: Path, tmp_path: Path
) -> None:
    backend = trainer(model_dir)
    with (
        reference_server_in_thread(model_dir, weight_version="0") as engine,
        adapter(engines=[engine.url]) as a,
    ):
        publisher = make_publisher(config(a.url, tmp_path / "weights", keep=3))
        move_weights(backend, seed=11)
        publisher.publish(backend)
        published = {k: v.clone() for k, v in backend.actor.state_dict().items()}
        # The trainer goes back to version 1 with other weights (a resume gone wrong).
        move_weights(backend, seed=12)
        backend.version = 1
        with pytest.raises(PublishError, match="exists with other weights"):
            publisher.publish(backend)
        backend.version = 0  # a version below the served one: the adapter refuses it
        with pytest.raises(
            PublishError, match=r"refused POST /admin/weights \(HTTP 409\).*version must increase"
        ):
            publisher.publish(backend)
        backend.actor.load_state_dict(published)
        backend.version = 1  # the published version and weights again: idempotent
        again = publisher.publish(backend)
        assert again is not None and again.adapter == {"idempotent": True}
        output, logprobs, version = served(engine.url)
        assert version == "1"
        assert max_gap(logprobs, recomputed(backend, output)) < 1e-5
        publisher.close()


def test_the_adapter_checks_the_manifest_and_the_checksum(
    adapter: AdapterFactory, model_dir: Path, tmp_path: Path
) -> None:
    """The adapter verifies a published directory against its manifest before it drains
    anything, refuses a version re-sent with another checksum, and takes the same version
    and checksum again as a no-op."""
    backend = trainer(model_dir)
    weights = tmp_path / "weights"
    with (
        reference_server_in_thread(model_dir, weight_version="0") as engine,
        adapter(engines=[engine.url]) as a,
    ):
        publisher = make_publisher(config(a.url, weights, keep=3))
        move_weights(backend, seed=21)
        publisher.publish(backend)
        checksum = json.loads((weights / "v1/manifest.json").read_text())["weights_sha256"]
        view = a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()
        assert view["weights_sha256"] == checksum and view["refreshes"] == 1

        def refresh(path: Path, version: int, sha: str | None) -> httpx.Response:
            body = {"model_path": str(path), "version": version}
            if sha is not None:
                body["weights_sha256"] = sha
            return a.http.post(f"{a.url}/admin/weights", json=body, headers=a.admin())

        same = refresh(weights / "v1", 1, checksum)  # the same version and weights: no-op
        assert same.status_code == 200 and same.json()["idempotent"] is True
        other = refresh(weights / "v1", 1, "0" * 64)
        assert other.status_code == 409 and other.json()["error"]["code"] == "version_conflict"
        # v2 on disk with one byte of its weights changed after the manifest was written
        move_weights(backend, seed=22)
        backend.version = 2
        tampered = export_version(backend, weights, 2)
        data = bytearray((tampered / "model.safetensors").read_bytes())
        data[-1] ^= 0xFF
        (tampered / "model.safetensors").write_bytes(bytes(data))
        bad = refresh(tampered, 2, None)
        assert bad.status_code == 400, bad.text
        assert "model.safetensors does not match its sha256 in manifest.json" in bad.text
        wrong = refresh(weights / "v1", 2, "1" * 64)  # a checksum the manifest does not carry
        assert wrong.status_code == 400 and "the refresh names" in wrong.text
        view = a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()
        assert (view["current_version"], view["refreshes"]) == (1, 1)  # nothing moved
        assert view["gate_open"] is True and served(engine.url)[2] == "1"
        publisher.close()


def test_each_engine_is_spot_checked_after_the_load(
    adapter: AdapterFactory, model_dir: Path, tmp_path: Path
) -> None:
    """The publisher sends the first values of two 1-D tensors; the adapter reads them back
    from the engine after it loads (SGLang's /get_weights_by_name). Values the engine does not
    hold fail its load: with no engine loaded, a 502, the version unchanged, and the engine
    reloaded with the current weights before it serves again."""
    backend = trainer(model_dir)
    weights = tmp_path / "weights"
    # SGLang reads weights back for llama-class models only; the tiny model is a Qwen3, for
    # which the check is unverifiable (tests/conformance): the engine answers as for llama
    always = ("--get-weights-by-name", "always")
    with (
        reference_server_in_thread(model_dir, weight_version="0", extra_args=always) as engine,
        adapter(engines=[engine.url]) as a,
    ):
        publisher = make_publisher(config(a.url, weights, keep=3))
        move_weights(backend, seed=31)
        result = publisher.publish(backend)
        assert result is not None
        assert result.adapter["engines"][engine.url]["probes_checked"] == 2
        assert "unverifiable" not in result.adapter["engines"][engine.url]
        # the reference engine computes in float32 like the trainer
        assert result.adapter["engines"][engine.url]["logprob_probe_gap"] < 1e-4
        probes = directory_probes(weights / "v1")
        assert len(probes) == 2
        published = {k: v.clone() for k, v in backend.actor.state_dict().items()}
        norm = published["model.norm.weight"]
        ask = {"name": "model.norm.weight", "truncate_size": 3}
        values = httpx.post(f"{engine.url}/get_weights_by_name", json=ask).json()
        assert values == norm[:3].tolist()  # the reference engine answers as SGLang does
        # v2 on disk, announced with values it does not hold
        move_weights(backend, seed=32)
        backend.version = 2
        path = export_version(backend, weights, 2)
        wrong = [{**p, "values": [v + 1.0 for v in p["values"]]} for p in probes]
        body = {"model_path": str(path), "version": 2, "probes": wrong}
        r = a.http.post(f"{a.url}/admin/weights", json=body, headers=a.admin())
        assert r.status_code == 502 and "weights check after loading" in r.text, r.text
        view = a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()
        assert view["current_version"] == 1
        deadline = time.monotonic() + 20
        while not a.http.get(f"{a.url}/health").json()["engines"][engine.url]:
            assert time.monotonic() < deadline, "the engine was not readmitted"
            time.sleep(0.1)
        backend.actor.load_state_dict(published)
        output, logprobs, version = served(engine.url)
        assert version == "1"  # reloaded (and checked) before it rejoined
        assert max_gap(logprobs, recomputed(backend, output)) < 1e-5
        publisher.close()


def test_a_load_of_other_weights_fails_the_logprob_check_where_weights_are_not_read_back(
    adapter: AdapterFactory, model_dir: Path, tmp_path: Path
) -> None:
    """The tiny model is a Qwen3: the engine refuses /get_weights_by_name as SGLang does, so
    the probes are unverifiable; the logprob probe still compares what the engine computes
    with what the trainer's weights do. A directory that holds other weights than the probe
    was computed from (here one corrupted tensor) fails the load; the engine is reloaded with
    the current version, checked the same way, before it serves again."""
    backend = trainer(model_dir)
    weights = tmp_path / "weights"
    with (
        reference_server_in_thread(model_dir, weight_version="0") as engine,
        adapter(engines=[engine.url]) as a,
    ):
        publisher = make_publisher(config(a.url, weights, keep=3))
        move_weights(backend, seed=41)
        result = publisher.publish(backend)
        assert result is not None
        loaded = result.adapter["engines"][engine.url]
        assert loaded["ok"] and "Get parameter by name failed" in loaded["unverifiable"]
        assert loaded["logprob_probe_gap"] < 1e-4  # float32 on both sides
        probe = logprob_probe(backend)
        published = {k: v.clone() for k, v in backend.actor.state_dict().items()}
        # v2 on disk with a corrupted tensor, announced with the probe of the weights above
        with torch.no_grad():
            backend.actor.get_parameter("model.norm.weight").mul_(20.0)
        backend.version = 2
        path = export_version(backend, weights, 2)
        body = {"model_path": str(path), "version": 2, "logprob_probe": probe}
        r = a.http.post(f"{a.url}/admin/weights", json=body, headers=a.admin())
        assert r.status_code == 502 and "logprob check after loading" in r.text, r.text
        assert "nats on average" in r.text
        view = a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()
        assert view["current_version"] == 1
        deadline = time.monotonic() + 20
        while not a.http.get(f"{a.url}/health").json()["engines"][engine.url]:
            assert time.monotonic() < deadline, "the engine was not readmitted"
            time.sleep(0.1)
        backend.actor.load_state_dict(published)
        output, logprobs, version = served(engine.url)
        assert version == "1"  # reloaded (and checked) before it rejoined
        assert max_gap(logprobs, recomputed(backend, output)) < 1e-5
        publisher.close()
