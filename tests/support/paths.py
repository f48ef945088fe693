"""Where the repository and the shipped test data are, for every test module wherever it lives."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_DATA = REPO_ROOT / "tests" / "data"
