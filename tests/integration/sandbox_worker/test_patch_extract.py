"""The host-side patch extraction through the real backends (private dockerd, bwrap).

What the agent does is done by ``exec`` in a real sandbox of the tiny test image; the patch is
taken by :func:`extract_patch` (``copy_out`` + the host's git) and compared with the old
in-sandbox command (:data:`OLD_DIFF`, what ``Sandbox.diff`` ran before), run in the same sandbox
afterwards. ``Sandbox.diff`` itself is now the host extraction: the attack tests check it too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from sandbox_worker.backends import Sandbox, SandboxBackend, SandboxInfraError, SandboxSpec
from sandbox_worker.patch_extract import PatchRefusedError, PatchTooLargeError, extract_patch
from tests.integration.sandbox_worker.conftest import SessionEnv

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

_G = "git -c core.fileMode=false -c core.quotePath=false"
OLD_DIFF = f"{{ {_G} add -A && {_G} diff --cached --no-color --binary BASE; }} 2>/dev/null"
WORKDIR = "/testbed"

HONEST_EDITS = r"""
set -e
sed -i 's/a + b/a + b  # fixed/' calc.py
git mv README.md 'READ ME.md'
printf '\000\001\002binary' > data.bin
ln -s calc.py 'ünïcode link'
mkdir -p pkg/sub && echo 'x = 1' > 'pkg/sub/new file.py'
printf '*.pyc\n' > .gitignore && echo junk > ignored.pyc
rm test_calc.py
"""

FORGED_GOLD = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
    " def add(a, b):\n-    return a + b\n+    return a + b  # the gold fix\n"
)


@pytest.fixture
def sandbox(backend: SandboxBackend, node: str, sandbox_env: SessionEnv) -> Iterator[Sandbox]:
    spec = SandboxSpec(image=sandbox_env.image, node=node, sandbox_id=f"p{uuid.uuid4().hex[:10]}")
    sb = backend.create(spec)
    try:
        yield sb
    finally:
        sb.destroy()


def _run(sb: Sandbox, script: str) -> str:
    res = sb.exec(script, workdir=WORKDIR, timeout_s=60)
    assert res.exit_code == 0, res.output
    return res.output


def _base(sb: Sandbox) -> str:
    return _run(sb, "git rev-parse HEAD").strip()


def test_honest_edits_give_the_old_patch_byte_for_byte(sandbox: Sandbox) -> None:
    base = _base(sandbox)
    _run(sandbox, HONEST_EDITS)
    new = extract_patch(sandbox, base, WORKDIR)
    old = _run(sandbox, OLD_DIFF.replace("BASE", base))
    assert new == old
    assert "rename from README.md\nrename to READ ME.md" in new
    assert "GIT binary patch" in new and "ünïcode link" in new and "ignored.pyc" not in new
    assert "diff --git a/test_calc.py b/test_calc.py\ndeleted file mode" in new


def test_diff_external_cannot_forge_a_gold_patch(sandbox: Sandbox) -> None:
    """The agent changes nothing useful and makes git print the gold patch instead."""
    base = _base(sandbox)
    sandbox.write_file("/tmp/gold.diff", FORGED_GOLD.encode())
    sandbox.write_file("/tmp/forge.sh", b"#!/bin/sh\ncat /tmp/gold.diff\n", mode=0o755)
    _run(sandbox, "git config diff.external /tmp/forge.sh && echo '# note' >> README.md")
    assert FORGED_GOLD in _run(sandbox, OLD_DIFF.replace("BASE", base))  # the old diff is forged
    for patch in (extract_patch(sandbox, base, WORKDIR), sandbox.diff(base)):
        assert "the gold fix" not in patch
        assert patch.startswith("diff --git a/README.md b/README.md\n") and "+# note" in patch


def test_filter_and_textconv_of_the_agent_do_not_run(sandbox: Sandbox) -> None:
    base = _base(sandbox)
    sandbox.write_file("/tmp/evil.sh", b"#!/bin/sh\necho ran > /tmp/ran\ncat\n", mode=0o755)
    _run(
        sandbox,
        "echo '* filter=evil diff=evil' > .gitattributes && git config filter.evil.clean "
        "/tmp/evil.sh && git config diff.evil.textconv /tmp/evil.sh && echo '# x' >> calc.py",
    )
    patch = extract_patch(sandbox, base, WORKDIR)
    assert "+# x" in patch
    assert sandbox.exec("test -e /tmp/ran").exit_code != 0  # nothing ran, here or there


@pytest.mark.parametrize(
    "replace_git",
    [
        "mv .git /tmp/real-git && ln -s /tmp/real-git .git",  # symlink within the sandbox
        "rm -rf .git && ln -s / .git",  # symlink to a path that exists on every host
        "mv .git /tmp/real-git && echo 'gitdir: /tmp/real-git' > .git",
        "rm -rf .git/objects/*",
    ],
)
def test_a_repository_the_agent_broke_is_refused(sandbox: Sandbox, replace_git: str) -> None:
    base = _base(sandbox)
    _run(sandbox, f"echo change >> calc.py && {replace_git}")
    with pytest.raises(PatchRefusedError) as info:
        extract_patch(sandbox, base, WORKDIR)
    assert info.value.code in ("git_dir_invalid", "base_unavailable")
    with pytest.raises(SandboxInfraError, match="git diff failed"):
        sandbox.diff(base)


def test_symlinks_and_fifos_in_the_tree_are_not_followed_on_the_host(sandbox: Sandbox) -> None:
    base = _base(sandbox)
    _run(sandbox, "ln -s /etc/hostname host-file && mkfifo pipe && ln -s /etc etc-dir")
    patch = extract_patch(sandbox, base, WORKDIR)
    assert "+/etc/hostname\n\\ No newline at end of file" in patch  # the link, not its target
    assert "diff --git a/etc-dir b/etc-dir\nnew file mode 120000" in patch
    assert "pipe" not in patch


def test_a_patch_over_the_cap_is_refused_whole(sandbox: Sandbox) -> None:
    base = _base(sandbox)
    _run(sandbox, "head -c 3000000 /dev/urandom | base64 > big.txt")
    with pytest.raises(PatchTooLargeError):
        extract_patch(sandbox, base, WORKDIR, max_bytes=2 << 20)
    assert len(extract_patch(sandbox, base, WORKDIR, max_bytes=4 << 20)) > 3_000_000
