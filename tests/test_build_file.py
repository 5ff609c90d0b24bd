"""The generated Bazel BUILD file: up to date, and stale once a file is added.

These tests run the generator only (no Bazel). Under `bazel test` this file
runs from Bazel's runfiles; gen_build.ROOT still names the real checkout,
since runfiles are symlinks into it.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tools import gen_build


def _write(root, files):
  """Writes {relative path: text, dedented} under root."""
  for path, text in files.items():
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
      f.write(textwrap.dedent(text))


@pytest.fixture(scope="module")
def fresh_checkout(tmp_path_factory):
  """The checkout's Python files with a BUILD generated for them, made once
  (gen_build reads the whole tree: seconds); tests copy it."""
  root = tmp_path_factory.mktemp("checkout")
  for path in gen_build.find_python_files(gen_build.ROOT) + [".bazelignore"]:
    os.makedirs(root / os.path.dirname(path), exist_ok=True)
    shutil.copy(os.path.join(gen_build.ROOT, path), root / path)
  assert gen_build.main(["gen_build.py", "--root", str(root)]) == 0
  assert gen_build.check(str(root)) == []
  return root


def _copy_of_checkout(fresh_checkout, tmp_path):
  """A copy of the fresh checkout (its BUILD up to date) to change."""
  root = tmp_path / "checkout"
  shutil.copytree(fresh_checkout, root)
  return str(root)


def test_checked_in_build_file_is_up_to_date():
  result = subprocess.run(
      [sys.executable, os.path.join(gen_build.ROOT, "tools", "gen_build.py"),
       "--check"], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("new_file", [
    "tf_interlock/new_module.py", "layers/new_layer.py", "tests/test_new.py",
    "train/new_job.py"])
def test_new_file_without_target_fails_the_check(fresh_checkout, tmp_path,
                                                 capsys, new_file):
  root = _copy_of_checkout(fresh_checkout, tmp_path)
  _write(root, {new_file: '"""New."""\n'})
  # `gen_build.py --check` (its main; the process is run above) exits 1
  # and names each stale target.
  capsys.readouterr()
  assert gen_build.main(["gen_build.py", "--check", "--root", root]) == 1
  lines = capsys.readouterr().err.splitlines()
  assert lines[-1] == "gen_build: run `make build-file` to regenerate BUILD"
  problems = [line.removeprefix("gen_build: ") for line in lines[:-1]]
  assert f"{new_file}: no up-to-date target in BUILD" in problems
  # Tests that take a whole folder (as data, or every module of a package
  # by name) go stale with it; no library or binary target does.
  others = [p for p in problems if not p.startswith(new_file)]
  assert all(p.startswith("tests/test_") for p in others), problems
  if not new_file.startswith("tests/"):
    assert ("tests/test_import_direction.py: no up-to-date target in BUILD"
            in others)


def test_removed_file_leaves_stale_build(fresh_checkout, tmp_path):
  root = _copy_of_checkout(fresh_checkout, tmp_path)
  os.remove(os.path.join(root, "tests", "test_routing.py"))
  with pytest.raises(gen_build.BuildError, match="test_routing.py"):
    gen_build.check(root)  # Its size entry in TEST_SIZES is now stale.
  sizes = dict(gen_build.TEST_SIZES)
  del sizes["tests/test_routing.py"]
  assert gen_build.check(root, test_sizes=sizes) == [
      "BUILD has stale or edited targets"]


def test_targets_and_deps(tmp_path):
  _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/core.py": "import numpy\nfrom pkg import util\n",
      "pkg/util.py": "from . import sub\n",
      "pkg/sub/__init__.py": "X = 1\n",
      "pkg/sub/leaf.py": "from pkg.sub import X\n",
      "train/__init__.py": "",
      "train/config.py": """\
          import importlib

          def load(name):
            return importlib.import_module(f"train.presets.{name}")
          """,
      "train/presets/__init__.py": "",
      "train/presets/small.py": "from train import config\n",
      "train/job.py": """\
          from pkg.sub import leaf
          from train import config

          if __name__ == "__main__":
            leaf.run(config.load("small"))
          """,
      "tests/conftest.py": "import pytest\n",
      "tests/helpers.py": "import pkg.core\n",
      "tests/test_job.py": """\
          import subprocess
          import sys

          from tests import helpers

          def test_job():
            subprocess.run([sys.executable, "-m", "train.job"], check=True)
          """,
      "tests/test_other.py": "from train.presets import small\n",
      "tools/sweep.py": """\
          import subprocess
          import sys

          if __name__ == "__main__":
            subprocess.run([sys.executable, "-m", "tests.helpers"])
          """,
      ".venv/lib/site.py": "import pkg\n",
      "runs/scratch.py": "",
  })
  _write(tmp_path, {".bazelignore": "runs/\n"})
  targets = gen_build.generate_targets(
      str(tmp_path), test_sizes={"tests/test_job.py": "small"})

  assert sorted(targets) == [
      "pkg/__init__.py", "pkg/core.py", "pkg/sub/__init__.py",
      "pkg/sub/leaf.py", "pkg/util.py", "tests/conftest.py",
      "tests/helpers.py", "tests/test_job.py", "tests/test_other.py",
      "tools/sweep.py", "train/__init__.py", "train/config.py",
      "train/job.py", "train/presets/__init__.py", "train/presets/small.py"]
  # A package's own __init__ is not a dep of its modules; others' are.
  assert targets["pkg/core.py"] == textwrap.dedent("""\
      py_library(
          name = "pkg_core",
          srcs = ["pkg/core.py"],
          deps = [":pkg_util"],
      )
      """)
  assert 'deps = [":pkg_sub"]' in targets["pkg/util.py"]
  assert "deps" not in targets["pkg/sub/leaf.py"]
  assert targets["tests/helpers.py"] == textwrap.dedent("""\
      py_library(
          name = "tests_helpers",
          srcs = ["tests/helpers.py"],
          testonly = True,
          deps = [
              ":pkg",
              ":pkg_core",
          ],
      )
      """)
  # Presets loaded by name import the config: no library deps on them...
  assert "deps" not in targets["train/config.py"]
  assert 'deps = [":train_config"]' in targets["train/presets/small.py"]
  # ...but the binaries and tests that reach the config get them.
  assert targets["train/job.py"] == textwrap.dedent("""\
      py_library(
          name = "train_job",
          srcs = ["train/job.py"],
          deps = [
              ":pkg",
              ":pkg_sub",
              ":pkg_sub_leaf",
              ":train_config",
          ],
      )

      py_binary(
          name = "train_job_bin",
          srcs = ["train/job.py"],
          main = "train/job.py",
          deps = [
              ":train_job",
              ":train_presets",
              ":train_presets_small",
          ],
      )
      """)
  assert targets["tests/test_job.py"] == textwrap.dedent("""\
      py_test(
          name = "tests_test_job",
          size = "small",
          srcs = [
              "tests/test_job.py",
              "tools/pytest_main.py",
          ],
          main = "tools/pytest_main.py",
          args = ["tests/test_job.py"],
          data = ["pytest.ini"],
          deps = [
              ":tests_conftest",
              ":tests_helpers",
              ":train",
              ":train_job",
              ":train_presets",
              ":train_presets_small",
          ],
      )
      """)
  # Bazel refuses a binary that runs a testonly helper unless it is testonly.
  assert "testonly" not in targets["tools/sweep.py"].split("py_binary")[0]
  assert textwrap.dedent("""\
      py_binary(
          name = "tools_sweep_bin",
          srcs = ["tools/sweep.py"],
          main = "tools/sweep.py",
          testonly = True,
          deps = [
              ":tests_helpers",
              ":tools_sweep",
          ],
      )
      """) in targets["tools/sweep.py"]
  assert 'size = "medium"' in targets["tests/test_other.py"]
  assert textwrap.indent(textwrap.dedent("""\
      deps = [
          ":tests_conftest",
          ":train",
          ":train_presets",
          ":train_presets_small",
      ],
      """), "    ") in targets["tests/test_other.py"]


def test_bad_trees_are_reported(tmp_path):
  _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "\nimport pkg.gone\n"})
  with pytest.raises(gen_build.BuildError,
                     match=r"pkg/a.py:2: import of pkg.gone matches no"):
    gen_build.generate_targets(str(tmp_path), test_sizes={})
  with pytest.raises(gen_build.BuildError, match="not a test file"):
    gen_build.generate_targets(str(tmp_path), test_sizes={"pkg/a.py": "small"})
  _write(tmp_path, {"pkg/a.py": "from tests import test_b\n",
                    "tests/test_b.py": ""})
  with pytest.raises(gen_build.BuildError, match="pkg/a.py:1: imports a test"):
    gen_build.generate_targets(str(tmp_path), test_sizes={})
  _write(tmp_path, {"pkg/a.py": "def (\n"})
  with pytest.raises(gen_build.BuildError, match="pkg/a.py:1: invalid syntax"):
    gen_build.generate_targets(str(tmp_path), test_sizes={})
  _write(tmp_path, {"pkg/a.py": "", "pkg_a.py": ""})
  with pytest.raises(gen_build.BuildError, match="map to one target, pkg_a"):
    gen_build.generate_targets(str(tmp_path), test_sizes={})
  os.remove(tmp_path / "pkg_a.py")
  _write(tmp_path, {"pkg/a.py": 'if __name__ == "__main__":\n  pass\n',
                    "pkg/a_bin.py": ""})
  with pytest.raises(gen_build.BuildError, match="one target, pkg_a_bin"):
    gen_build.generate_targets(str(tmp_path), test_sizes={})
