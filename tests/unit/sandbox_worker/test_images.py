"""Image naming per dataset (sandbox_worker/images.py), one rule per test.

Expected names are published facts: the 500 SWE-bench Verified images from
tests/data/swebench_verified/index.jsonl (see its README); SWE-Gym and SWE-smith names as
published images are referenced in public projects (OpenHands/SkyRL SWE-Gym images
``xingyaoww/sweb.eval.x86_64.project-monai_s_monai-1121``, ``...conan-io_s_conan-14177``;
SWE-smith ``jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536`` for instance
``oauthlib__oauthlib.1fd52536.lm_rewrite__q9ve64pd``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_worker import images
from sandbox_worker.backends.base import ImageNotFoundError
from tests.support.paths import TEST_DATA

INDEX = [
    json.loads(line)
    for line in (TEST_DATA / "swebench_verified" / "index.jsonl").read_text().splitlines()
]


def test_swebench_names_equal_the_published_images() -> None:
    assert len(INDEX) == 500
    for entry in INDEX:
        assert images.swebench_image(entry["instance_id"]) == entry["image"]


@pytest.mark.parametrize(
    ("instance_id", "image"),
    [
        (
            "Project-MONAI__MONAI-1121",
            "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-1121:latest",
        ),
        ("conan-io__conan-14177", "xingyaoww/sweb.eval.x86_64.conan-io_s_conan-14177:latest"),
        ("dask__dask-7656", "xingyaoww/sweb.eval.x86_64.dask_s_dask-7656:latest"),
    ],
)
def test_swegym_names(instance_id: str, image: str) -> None:
    assert images.swegym_image(instance_id) == image


def test_swesmith_names_are_per_repository_snapshot() -> None:
    a = images.swesmith_image("oauthlib__oauthlib.1fd52536.lm_rewrite__q9ve64pd")
    b = images.swesmith_image("oauthlib__oauthlib.1fd52536.func_basic__001")
    assert a == b == "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest"
    assert (
        images.swesmith_image("andialbrecht__sqlparse.e57923b3.combine_file__x")
        == "jyangballin/swesmith.x86_64.andialbrecht_1776_sqlparse.e57923b3:latest"
    )
    snap = images.swesmith_snapshot("pallets__flask.abc12345.func_basic__001")
    assert (snap.repo, snap.commit8) == ("pallets/flask", "abc12345")
    with pytest.raises(ValueError, match="not a SWE-smith instance id"):
        images.swesmith_snapshot("django__django-11099")


def test_swesmith_row_image_name_wins_and_gets_its_namespace() -> None:
    iid = "pallets__flask.abc12345.func_basic__001"
    bare = "swesmith.x86_64.pallets_1776_flask.abc12345"
    assert images.swesmith_image(iid, image_name=bare) == f"jyangballin/{bare}:latest"
    full = "mirror.local/swesmith.x86_64.pallets_1776_flask.abc12345:v2"
    assert images.swesmith_image(iid, image_name=full) == full


def test_local_images_are_namespaced_by_dataset() -> None:
    a = images.local_image("my-tasks", "acme__tool-7")
    b = images.local_image("other", "acme__tool-7")
    assert a == "swerl/my-tasks/sweb.eval.x86_64.acme_1776_tool-7:latest"
    assert a != b and b.startswith("swerl/other/")
    assert a != images.swebench_image("acme__tool-7")
    for bad in ("My Tasks", "", "a/b", "../x"):
        with pytest.raises(ValueError, match="invalid dataset name"):
            images.local_image(bad, "acme__tool-7")


def test_label_check_per_image_kind() -> None:
    commit = "a" * 40
    labels = {"swerl.repo": "acme/tool", "swerl.base_commit": commit}
    assert images.label_mismatch("img", labels, repo="acme/tool", commit=commit) is None
    wrong = images.label_mismatch("img", labels, repo="acme/tool", commit="b" * 40)
    assert wrong is not None and f"acme/tool@{commit}" in wrong and "b" * 40 in wrong
    missing = images.label_mismatch("img", {}, repo="acme/tool", commit=commit)
    assert missing is not None and "no swerl.base_commit label" in missing
    # SWE-smith: one image per repository snapshot; repository and commit prefix must match.
    snap = {"swerl.repo": "pallets/flask", "swerl.base_commit": "abc12345" + "0" * 32}
    ok = images.label_mismatch("img", snap, repo="pallets/flask", commit="abc12345", swesmith=True)
    assert ok is None
    other_repo = images.label_mismatch(
        "img", snap, repo="pallets/click", commit="abc12345", swesmith=True
    )
    assert other_repo is not None and "pallets/click@abc12345" in other_repo


def test_a_tree_stamp_keeps_the_images_swerl_labels(tmp_path: Path) -> None:
    (tmp_path / "tree" / "usr").mkdir(parents=True)
    labels = images.swerl_labels({"swerl.repo": "acme/tool", "swerl.base_commit": "a" * 40,
                                  "maintainer": "someone"})  # fmt: skip
    assert labels == {"swerl.repo": "acme/tool", "swerl.base_commit": "a" * 40}
    info = images.RootfsInfo("acme/img:1", "sha256:x", tmp_path / "tree", None, (), "/", labels)
    stamp = images.rootfs_stamp("acme/img:1", tmp_path)
    stamp.parent.mkdir(parents=True)
    stamp.write_text(info.to_json())
    assert images.rootfs_info("acme/img:1", tmp_path) == info
    # a stamp written before trees carried labels: no labels known (the HEAD check still runs)
    old = json.loads(stamp.read_text())
    del old["labels"]
    stamp.write_text(json.dumps(old))
    assert images.rootfs_info("acme/img:1", tmp_path).labels is None
    old["labels"] = ["not", "a", "map"]
    stamp.write_text(json.dumps(old))
    with pytest.raises(ImageNotFoundError, match="bad labels"):
        images.rootfs_info("acme/img:1", tmp_path)


def test_a_task_sets_build_namespace_gives_its_local_images() -> None:
    """One rule: what the build names under the set's namespace is what workers resolve."""
    namespace = images.local_namespace("my-tasks")
    for iid in ("acme__tool-7", "Acme__Tool-8"):
        assert images.instance_image(iid, namespace=namespace) == images.local_image(
            "my-tasks", iid
        )
    assert images.local_image("my-tasks", "acme__tool-7").startswith(namespace + "/")
    with pytest.raises(ValueError, match="invalid dataset name"):
        images.local_namespace("a/b")
