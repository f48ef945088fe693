"""The pull subcommand's naming per dataset and its summary (the engine side is in
tests/integration/sandbox_worker/images/test_images.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_worker.image_pull import PullResult, image_name, report
from services.protocol.instance import SWEInstance

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"


def _inst(instance_id: str, **extra: object) -> SWEInstance:
    row = {"instance_id": instance_id, "repo": "o/r", "patch": PATCH, "problem_statement": ""}
    row |= {"FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": [], **extra}  # extra may replace repo
    return SWEInstance.model_validate(row)


def test_names_follow_each_dataset() -> None:
    django = _inst("django__django-11099")
    assert image_name(django, "swebench") == (
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
    assert image_name(_inst("Project-MONAI__MONAI-1121"), "swegym") == (
        "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-1121:latest"
    )
    smith = _inst("oauthlib__oauthlib.1fd52536.lm_rewrite__q9ve64pd")
    assert image_name(smith, "swesmith") == (
        "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest"
    )
    row_named = _inst("a__b.12345678.x", image_name="me/custom:v1")
    assert image_name(row_named, "swesmith") == "me/custom:v1"
    assert image_name(django, "swebench", "127.0.0.1:5000").startswith("127.0.0.1:5000/swebench/")
    with pytest.raises(ValueError, match="invalid registry"):
        image_name(django, "swebench", "https://mirror")
    with pytest.raises(ValueError, match="unknown dataset"):
        image_name(django, "swe-other")


def test_a_swesmith_row_keeps_its_image_in_a_mixture() -> None:
    """A SWE-smith row (repo in SWE-smith's mirror organisation) has only SWE-smith's image:
    a SWE-Gym worker or pull names it so, and a SWE-Gym row keeps SWE-Gym's."""
    smith = _inst(
        "oauthlib__oauthlib.1fd52536.lm_rewrite__q9", repo="swesmith/oauthlib__oauthlib.1fd52536"
    )
    want = "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest"
    assert smith.is_swesmith
    assert image_name(smith, "swegym") == image_name(smith, "swebench") == want
    gym = _inst("Project-MONAI__MONAI-1121")
    assert image_name(gym, "swegym").startswith("xingyaoww/")


def test_report_counts_and_lists_missing(tmp_path: Path) -> None:
    results = [
        PullResult("a:1", ("a-1",), "present"),
        PullResult("b:1", ("b-1", "b-2"), "missing", "connection refused"),
        PullResult("c:1", ("c-1",), "pulled"),
    ]
    out = tmp_path / "missing.txt"
    assert report(results, out) == 1
    assert out.read_text() == "b-1\nb-2\n"
    assert report(results[:1], None) == 0
