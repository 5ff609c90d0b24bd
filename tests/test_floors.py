"""tests/floors.py: each test file's floor, read from the file itself."""

import pytest

from tests import floors


@pytest.mark.parametrize("text,floor", [
    ("import numpy\nfrom tools import gen_build\n", "library"),
    ("from tf_interlock import export\nimport layers.common\n", "library"),
    ("from train import config\n", "train"),
    ("def f():\n  import research.compare\n", "research"),  # nested
    ("ARGS = ['x', 'train.export']\n", "train"),  # a binary run by name
    ("from research import x\nfrom train import y\n", "research"),
])
def test_the_highest_floor_reached_wins(tmp_path, text, floor):
  path = tmp_path / "test_x.py"
  path.write_text(text)
  assert floors.floor_of(str(path)) == floor


def test_a_tests_helper_counts_as_part_of_the_file(tmp_path):
  (tmp_path / "jobs.py").write_text("RUN = 'research.benchmark'\n")
  (tmp_path / "test_x.py").write_text("from tests import jobs\n")
  assert floors.floor_of(str(tmp_path / "test_x.py")) == "research"


def test_every_collected_test_carries_its_files_floor(request):
  assert request.node.get_closest_marker("library") is not None
