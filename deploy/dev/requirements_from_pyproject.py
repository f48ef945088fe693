"""Print the pinned requirements of pyproject.toml (plus the named extras), one per line.

With ``--no-deps``: the packages of ``[tool.swerl] no-deps``, installed without dependencies.

The set-up script installs dependencies only (the project runs from its checkout), so one
cached environment serves every clone.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def main(extras: list[str]) -> None:
    data = tomllib.loads(Path("pyproject.toml").read_text())
    if extras == ["--no-deps"]:
        print("\n".join(data["tool"]["swerl"]["no-deps"]))
        return
    project = data["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs.extend(project["optional-dependencies"][extra])
    print("\n".join(reqs))


if __name__ == "__main__":
    main(sys.argv[1:])
