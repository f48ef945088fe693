"""The instruction an agent gets for a SWE task.

Written in the style of the OpenHands SWE-bench prompt (the repository is uploaded at a path,
the issue is quoted in tags, tests are already taken care of, the environment is installed,
make minimal changes to non-test files), so that a policy trained here sees the same kind of
task it will be evaluated on. The wording is ours.
"""

from __future__ import annotations

import re

_REPO_DIR_RE = re.compile(r"^/[A-Za-z0-9._\-/]*$")

_TEMPLATE = """<uploaded_files>
{repo_dir}
</uploaded_files>

A Python code repository has been uploaded to the directory {repo_dir}. Consider the following \
issue description:

<issue_description>
{problem_statement}
</issue_description>

Implement the changes to the repository that resolve the <issue_description>.
Any changes to test files that the issue calls for have already been made, so do not modify \
the tests or the testing logic.
The Python environment is already set up with all dependencies installed; do not install \
other packages.
Make the minimal changes to non-test files in {repo_dir} that resolve the issue.

Work in these phases:
1. READ: restate the problem in your own words: what is wrong, where it shows, what is expected.
2. EXPLORE: find the files and functions related to the problem (grep, view files).
3. REPRODUCE: write a small script that shows the problem and run it.
4. FIX: make the smallest change that addresses the cause, not just the symptom.
5. VERIFY: rerun your script and the existing tests of the code you touched; think about edge \
cases.
6. REVIEW: compare your change with the issue once more; remove scratch files you created.

Do not commit your changes with git. When you are done, call the finish tool.
"""


def build_swe_prompt(problem_statement: str, repo_dir: str = "/testbed") -> str:
    """The user message for one SWE task: ``problem_statement`` about the repo at ``repo_dir``."""
    if not isinstance(problem_statement, str) or not problem_statement.strip():
        raise ValueError("problem_statement must be a non-empty string")
    if not _REPO_DIR_RE.match(repo_dir) or "//" in repo_dir or "/../" in f"{repo_dir}/":
        raise ValueError(f"repo_dir must be a plain absolute path, got {repo_dir!r}")
    return _TEMPLATE.format(repo_dir=repo_dir, problem_statement=problem_statement.strip())
