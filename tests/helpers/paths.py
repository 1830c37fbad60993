"""Where the tests' files are, wherever a test module sits under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/: on a child's PYTHONPATH for `helpers.*`
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
