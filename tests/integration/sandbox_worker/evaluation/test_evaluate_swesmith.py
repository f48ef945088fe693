"""A SWE-smith row graded through the real docker backend: an image that holds a clean
repository snapshot (a mini instance's repository with its fix and tests committed, as
SWE-smith's images hold theirs) becomes the task in the evaluation's own sandbox (bug applied,
F2P tests hidden, then restored for the run); the fix resolves it, an empty patch does not, and
a patch writing its own passing tests at the hidden path does not either."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import docker
import pytest

from sandbox_worker import images
from sandbox_worker.backends import SandboxBackend
from sandbox_worker.evaluation import evaluate_patch
from sandbox_worker.evaluation.patches import files_of_test_ids
from sandbox_worker.task_state import GIT_IDENTITY
from services.protocol.diff_reverse import reverse_unified_diff
from services.protocol.instance import SWEInstance

SOURCE = "swerl__strkit-1"


@pytest.fixture
def snapshot_image(instances: dict[str, SWEInstance]) -> Iterator[tuple[str, str]]:
    """The mini image with the fix and the tests committed: (image, snapshot commit)."""
    source = instances[SOURCE]
    client = docker.DockerClient(base_url=images.docker_host())
    tag = f"swerl-test/swesmith-snapshot:{uuid.uuid4().hex[:8]}"
    script = (
        "set -e; cd /testbed; git apply /dev/stdin <<'EOF_GOLD'\n"
        f"{source.patch}\nEOF_GOLD\n"
        "git apply /dev/stdin <<'EOF_TEST'\n"
        f"{source.test_patch}\nEOF_TEST\n"
        "git add -A && git commit -q -m snapshot && git rev-parse HEAD"
    )
    container = client.containers.create(
        images.instance_image(SOURCE), ["bash", "-c", script], environment=GIT_IDENTITY,
        network_mode="none",
    )  # fmt: skip
    try:
        container.start()
        assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()
        commit = container.logs().decode().strip().splitlines()[-1]
        container.commit(*tag.split(":"))
    finally:
        container.remove(force=True)
    try:
        yield tag, commit
    finally:
        client.images.remove(tag, force=True)
        client.close()


def test_a_swesmith_row_is_graded_on_its_task_state_in_docker(
    eval_backends: dict[str, SandboxBackend],
    instances: dict[str, SWEInstance],
    node: str,
    snapshot_image: tuple[str, str],
) -> None:
    image, commit = snapshot_image
    source = instances[SOURCE]
    row = SWEInstance(
        instance_id=f"swerl__strkit.{commit[:8]}.func_pm_remove_cond__x1",
        repo=f"swesmith/swerl__strkit.{commit[:8]}",
        patch=reverse_unified_diff(source.patch),
        problem_statement=source.problem_statement,
        FAIL_TO_PASS=source.FAIL_TO_PASS,
        PASS_TO_PASS=source.PASS_TO_PASS,
    )
    backend = eval_backends["docker"]

    def grade(patch: str):
        return evaluate_patch(backend, row, patch, image, node=node)

    gold = grade(row.gold_patch)
    assert gold.infra_error is None and gold.resolved and gold.reward == 1.0, gold.log_tail
    empty = grade("")
    assert empty.infra_error is None and not empty.resolved and empty.reward == 0.0
    (hidden,) = files_of_test_ids(row.FAIL_TO_PASS)[:1]
    fake = (
        f"diff --git a/{hidden} b/{hidden}\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/{hidden}\n@@ -0,0 +1,2 @@\n+def test_nothing():\n+    pass\n"
    )
    hack = grade(row.gold_patch.rstrip("\n") + "\n" + fake)  # the fix, plus its own tests
    assert hack.infra_error is None, hack.log_tail
    assert hack.resolved  # its file was replaced by the real tests, which the fix passes
    wrong = grade(fake)  # no fix, only its own tests: the real ones fail
    assert wrong.infra_error is None and not wrong.resolved and wrong.reward == 0.0
