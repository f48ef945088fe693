"""Distributed transport (issue 11): SGLang's broadcast protocol over gloo, 2 engines.

The trainer (this test process, rank 0) broadcasts bucket by bucket to two reference engine
subprocesses (ranks 1 and 2) while the adapter drives their ``update_weights_from_distributed``
calls -- the same trainer and adapter code that uses NCCL between GPUs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.integration.adapter.conftest import (
    ADMIN_TOKEN,
    ENGINE_START_TIMEOUT_S,
    AdapterFactory,
    RunningAdapter,
)
from tests.support.engines import ReferenceServer, launch_reference_server
from tests.support.publish import (
    max_gap,
    move_weights,
    recomputed,
    served,
    trainer,
)
from trainer.backends.torch_backend import TorchBackend
from trainer.publish import (
    DistributedPublisher,
    PublishConfig,
    PublishError,
    make_publisher,
    publish_metrics,
)


@pytest.fixture(scope="module")
def two_engines(model_dir: Path) -> Iterator[list[ReferenceServer]]:
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(
                launch_reference_server,
                model_dir,
                None,
                "0",
                # read weights back as SGLang does for llama-class models, so the probes are
                # compared (the tiny Qwen3 would make them unverifiable, as on SGLang)
                ("--get-weights-by-name", "always"),
                None,
                ENGINE_START_TIMEOUT_S,
            )
            for _ in range(2)
        ]
        errors = [f.exception() for f in futures]
    servers = [f.result() for f, e in zip(futures, errors, strict=True) if e is None]
    try:
        if any(errors):
            raise RuntimeError(f"engines did not start: {errors}")
        yield servers
    finally:
        for server in servers:
            server.stop()


LONG = 3000  # tokens per answer in the token-mode test


def config(url: str, bucket_mb: float, weights_dir: Path | None = None) -> PublishConfig:
    return PublishConfig(
        transport="distributed",
        adapter_url=url,
        admin_token=ADMIN_TOKEN,
        weights_dir=str(weights_dir or ""),
        keep_last=1,
        distributed={
            "backend": "gloo",
            "bucket_mb": bucket_mb,
            "timeout_s": 120,
            "export_to_disk": weights_dir is not None,
        },
    )


def versions(a: RunningAdapter) -> dict:
    return a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()


def wait_all_healthy(a: RunningAdapter, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(e["healthy"] for e in versions(a)["engines"]):
        assert time.monotonic() < deadline, versions(a)
        time.sleep(0.1)


def assert_serves(engines: list[ReferenceServer], backend: TorchBackend, version: int) -> None:
    for engine in engines:
        output, logprobs, reported = served(engine.url)
        assert reported == str(version), engine.url
        assert max_gap(logprobs, recomputed(backend, output)) < 1e-5, engine.url


def test_broadcast_publishes_to_every_engine(
    adapter: AdapterFactory, two_engines: list[ReferenceServer], tmp_path: Path
) -> None:
    with adapter(engines=[e.url for e in two_engines]) as a:
        backend = trainer(Path(a.service.config.model))
        backend.version = versions(a)["current_version"]
        # export_to_disk: each version also lands in v<N>/, the adapter's path for readmissions.
        publisher = make_publisher(config(a.url, bucket_mb=0.25, weights_dir=tmp_path))
        assert isinstance(publisher, DistributedPublisher)
        try:
            for seed in (1, 2):
                move_weights(backend, seed=seed)
                result = publisher.publish(backend)
                assert result is not None and result.transport == "distributed"
                assert len(result.bucket_s) > 1  # 0.9 MB of weights in 0.25 MB buckets
                assert versions(a)["current_version"] == backend.version
                reports = result.adapter["engines"]
                assert all(len(r["bucket_s"]) == len(result.bucket_s) for r in reports.values())
                assert all(r["probes_checked"] == 2 for r in reports.values())  # spot-checked
                assert_serves(two_engines, backend, backend.version)
                assert result.model_path == str(tmp_path / f"v{backend.version}")
                assert versions(a)["model_path"] == result.model_path
                manifest = json.loads((tmp_path / f"v{backend.version}/manifest.json").read_text())
                assert versions(a)["weights_sha256"] == manifest["weights_sha256"]
                metrics = publish_metrics(result)  # the step's publish/* metrics
                assert metrics["buckets"] == len(result.bucket_s)
                assert metrics["bucket_max"] == max(result.bucket_s) > 0
            assert [p.name for p in tmp_path.iterdir()] == [f"v{backend.version}"]  # keep_last 1
            # A trainer resumed from its last published checkpoint publishes the same version
            # with the same weights: a no-op (no broadcast), still served.
            refreshes = versions(a)["refreshes"]
            again = publisher.publish(backend)
            assert again is not None and again.adapter == {"idempotent": True}
            assert versions(a)["refreshes"] == refreshes and not again.bucket_s
            assert_serves(two_engines, backend, backend.version)
        finally:
            publisher.close()


def test_an_engine_of_two_tensor_parallel_workers_takes_two_ranks(
    adapter: AdapterFactory, two_engines: list[ReferenceServer], model_dir: Path
) -> None:
    """SGLang joins the group with every tensor-parallel worker (``rank_offset + tp_rank``):
    an engine with ``tp_size`` 2 (the reference engine's ``--tp-size 2`` takes the same two
    ranks) listed first shifts the next engine's offset by 2, and the world is 1 + 2 + 1."""
    wide = launch_reference_server(
        model_dir, None, "0", ("--tp-size", "2"), None, ENGINE_START_TIMEOUT_S
    )
    try:
        engines = [wide, two_engines[0]]
        with adapter(engines=[e.url for e in engines]) as a:
            assert [e["tp_size"] for e in versions(a)["engines"]] == [2, 1]
            backend = trainer(Path(a.service.config.model))
            backend.version = versions(a)["current_version"]
            publisher = make_publisher(config(a.url, bucket_mb=0.25))
            try:
                move_weights(backend, seed=7)
                result = publisher.publish(backend)
                assert result is not None and versions(a)["current_version"] == backend.version
                assert_serves(engines, backend, backend.version)
                assert publisher.group is not None and publisher.group.world_size == 4
            finally:
                publisher.close()
            group = {"master_address": "127.0.0.1", "master_port": 1, "world_size": 3,
                     "group_name": "g", "backend": "gloo"}  # fmt: skip
            r = a.http.post(f"{a.url}/admin/weights/group", json=group, headers=a.admin())
            assert r.status_code == 400 and "(tp_size [2, 1]), got 3" in r.text
    finally:
        wide.stop()


class Renamed:
    """A trainer whose broadcast does not fit the served model (one tensor renamed or
    reshaped); its disk copy is the real weights of the same version."""

    def __init__(self, backend: TorchBackend, rename: Mapping[str, str], reshape: str = "") -> None:
        self.backend, self.rename, self.reshape = backend, rename, reshape
        self.version = backend.version

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.backend.named_weights():
            if name == self.reshape:
                tensor = tensor.unsqueeze(0)  # one more dimension
            yield self.rename.get(name, name), tensor

    def export_hf(self, directory: str | Path) -> Path:
        return self.backend.export_hf(directory)


def bad_broadcast(backend: TorchBackend, fault: str) -> tuple[Renamed, str]:
    """The trainer's weights with its first tensor (in the first bucket: every later
    broadcast of the version waits for engines that stopped receiving) renamed or reshaped."""
    first = next(iter(dict(backend.named_weights())))
    if fault == "name":
        return Renamed(backend, {first: "model.layers.0.not_a_weight"}), "not_a_weight"
    return Renamed(backend, {}, reshape=first), f"{first} has shape"


@pytest.mark.parametrize("fault", ["name", "shape"])
def test_a_refused_bucket_abandons_the_broadcast_at_once_and_the_disk_copy_is_served(
    adapter: AdapterFactory, two_engines: list[ReferenceServer], fault: str, tmp_path: Path
) -> None:
    """SGLang applies buckets one by one: a bucket refused midway leaves an engine with a mix
    of two versions, and the trainer's broadcast of the next bucket can never complete. The
    adapter stops the version on every engine at the refused bucket, they leave the group,
    load the version from its disk copy (export_to_disk) and serve it; the trainer drops its
    group at once -- no timeout waited out -- and the next version forms it again."""
    with adapter(engines=[e.url for e in two_engines]) as a:
        backend = trainer(Path(a.service.config.model))
        backend.version = versions(a)["current_version"]
        publisher = make_publisher(config(a.url, bucket_mb=0.25, weights_dir=tmp_path))
        try:
            move_weights(backend, seed=7)
            publisher.publish(backend)
            move_weights(backend, seed=8)
            bad, needle = bad_broadcast(backend, fault)
            bad.version = backend.version
            started = time.perf_counter()
            result = publisher.publish(bad)  # type: ignore[arg-type]
            abandoned_s = time.perf_counter() - started
            assert result is not None
            print(f"\nabandoned version published from disk in {abandoned_s:.2f} s")
            assert abandoned_s < 60  # the group's timeout is 120 s: never waited out
            summary = result.adapter
            assert summary["broadcast_abandoned"] and summary["abandoned_at_bucket"] == 0
            for report in summary["engines"].values():
                assert report["ok"] and needle in report["repaired_from_disk"], report
            assert versions(a)["current_version"] == backend.version
            assert_serves(two_engines, backend, backend.version)
            assert publisher.group is None  # dropped; formed again by the next publish
            move_weights(backend, seed=9)
            again = publisher.publish(backend)
            assert again is not None and not again.adapter["broadcast_abandoned"]
            assert_serves(two_engines, backend, backend.version)
        finally:
            publisher.close()


def test_without_a_disk_copy_an_abandoned_version_is_refused_at_once_and_engines_wait_out(
    adapter: AdapterFactory, two_engines: list[ReferenceServer]
) -> None:
    """Without export_to_disk nothing can repair an engine that applied part of a version:
    the refresh is a 502 that says the broadcast was abandoned, the version stays, and the
    engines leave rotation (they report the old version but hold a mix) until a version with
    a disk copy can be loaded into them."""
    with adapter(engines=[e.url for e in two_engines]) as a:
        backend = trainer(Path(a.service.config.model))
        backend.version = versions(a)["current_version"]
        publisher = make_publisher(config(a.url, bucket_mb=0.25))
        try:
            served_version = backend.version
            move_weights(backend, seed=11)
            bad, needle = bad_broadcast(backend, "name")
            bad.version = backend.version
            started = time.perf_counter()
            with pytest.raises(PublishError, match="HTTP 502") as refused:
                publisher.publish(bad)  # type: ignore[arg-type]
            assert time.perf_counter() - started < 60
            assert needle in str(refused.value) and "abandoned at bucket 0" in str(refused.value)
            assert publisher.group is None
            view = versions(a)
            assert view["current_version"] == served_version
            assert not any(e["healthy"] for e in view["engines"])
            time.sleep(1.0)  # a few probe rounds: readmission cannot repair them
            view = versions(a)
            assert not any(e["healthy"] for e in view["engines"])
            assert all("no disk copy" in e["last_error"] for e in view["engines"]), view
        finally:
            publisher.close()


def test_bad_distributed_requests_are_refused_before_any_broadcast(
    adapter: AdapterFactory, two_engines: list[ReferenceServer]
) -> None:
    import httpx

    engine = two_engines[0].url
    bucket = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[4]]}
    # The engine: an unknown group, lists of different lengths, a non-float dtype -> 400.
    cases = [
        ({**bucket, "group_name": "never-made"}, "no weight update group 'never-made'"),
        ({**bucket, "dtypes": [], "group_name": "never-made"}, "differ in length"),
    ]
    # outside a weight-update session SGLang refuses before looking at the request
    r = httpx.post(f"{engine}/update_weights_from_distributed", json=cases[0][0], timeout=30)
    assert r.status_code == 400 and "begin_weight_update()" in r.json()["message"]
    assert httpx.post(f"{engine}/begin_weight_update", json={}, timeout=30).status_code == 200
    try:
        for body, needle in cases:
            r = httpx.post(f"{engine}/update_weights_from_distributed", json=body, timeout=30)
            assert r.status_code == 400 and r.json()["success"] is False
            assert needle in r.json()["message"]
    finally:
        assert httpx.post(f"{engine}/end_weight_update", json={}, timeout=30).status_code == 200
    r = httpx.post(
        f"{engine}/init_weights_update_group",
        json={
            "master_address": "127.0.0.1",
            "master_port": 1,
            "rank_offset": 3,
            "world_size": 3,
            "backend": "gloo",
        },
        timeout=30,
    )
    assert r.status_code == 400
    assert "rank_offset 3 + tp_size 1 exceeds world_size 3" in r.json()["message"]
    with adapter(engines=[e.url for e in two_engines]) as a:
        current = versions(a)["current_version"]
        group = {"master_address": "127.0.0.1", "master_port": 1, "world_size": 2}
        r = a.http.post(f"{a.url}/admin/weights/group", json=group, headers=a.admin())
        assert r.status_code == 400
        assert (
            "world_size must be 1 (trainer) + 2 ranks of the 2 engines"
            in r.json()["error"]["message"]
        )
        body = {"version": current + 1, "group_name": "nope", "buckets": [bucket]}
        r = a.http.post(f"{a.url}/admin/weights/distributed", json=body, headers=a.admin())
        assert r.status_code == 409 and "no weight update group 'nope'" in r.text
        bad = {**body, "buckets": [{**bucket, "shapes": [[4], [4]]}]}
        r = a.http.post(f"{a.url}/admin/weights/distributed", json=bad, headers=a.admin())
        assert r.status_code == 400 and "differ in length" in r.text
        r = a.http.post(f"{a.url}/admin/weights/distributed", json=body)
        assert r.status_code == 401  # the admin token is required
        assert versions(a)["current_version"] == current
        assert a.service.gate.is_open


def test_token_mode_broadcast_interrupts_and_continues_generation(
    adapter: AdapterFactory, two_engines: list[ReferenceServer], tmp_path: Path
) -> None:
    """The distributed transport under the token refresh mode: requests decoding when the
    broadcast lands are paused, the buckets load, and each continues under the new weights."""
    import httpx

    urls = [e.url for e in two_engines]
    with adapter(engines=urls, refresh_mode="token") as a:
        backend = trainer(Path(a.service.config.model))
        v0 = backend.version = versions(a)["current_version"]
        publisher = make_publisher(config(a.url, bucket_mb=0.25, weights_dir=tmp_path))

        def chat(i: int) -> httpx.Response:
            # The reference engine decodes ~1000 tokens/s per request: a budget of seconds keeps
            # every request decoding through the disk export that precedes the broadcast;
            # ignore_eos keeps a sampled end-of-sequence from ending one early (CI saw a request
            # stop before the other three were decoding).
            body = {
                "messages": [{"role": "user", "content": f"d{i}"}],
                "max_tokens": LONG,
                "ignore_eos": True,
            }
            return a.chat(f"dist-token-{i}", body)

        def running() -> int:
            return sum(
                httpx.get(f"{u}/get_server_info", timeout=10).json()["num_running_reqs"]
                for u in urls
            )

        try:
            with ThreadPoolExecutor(4) as pool:
                answers = [pool.submit(chat, i) for i in range(4)]
                deadline = time.monotonic() + 60
                while running() < 4:
                    early = [f.result().text for f in answers if f.done()]
                    assert not early, f"a request ended before all four were decoding: {early}"
                    assert time.monotonic() < deadline, "requests never all decoding"
                    time.sleep(0.01)
                move_weights(backend, seed=11)
                result = publisher.publish(backend)
                responses = [f.result() for f in answers]
            assert result is not None and result.adapter["mode"] == "token"
            assert result.adapter["drain_s"] == 0.0
            for i, response in enumerate(responses):
                assert response.status_code == 200, response.text
                turn = a.record(f"dist-token-{i}")["segments"][0]["turns"][0]
                assert len(turn["output_ids"]) == LONG, turn["finish_reason"]
                runs = turn["version_runs"]
                if runs:  # interrupted: old version first, then the broadcast one, once
                    assert [v for _, v in runs] == [v0, backend.version] and runs[1][0] > 0
            assert sum(bool(a.record(f"dist-token-{i}")["segments"][0]["turns"][0]["version_runs"])
                       for i in range(4)) >= 3  # fmt: skip
            assert_serves(two_engines, backend, backend.version)
        finally:
            publisher.close()
