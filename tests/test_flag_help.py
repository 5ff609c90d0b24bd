"""Every flag of every binary explains itself in its --help, and a
binary given a positional argument says so in one line.

A flag's help says what it does, its unit and what it accepts; a Config
field's flag (train/flags_lib.py) takes its help from the text stored beside
the field in train/config.py, so the two cannot drift. The binaries define
flags with the same names (--preset, --num_modules, ...), so one process
(tests.refusals.run_each_with_helps) imports each binary in turn,
forgetting the flags of the previous one, and reports {module: {flag:
help}}; the same process runs the refusals of a stray positional
argument and research.tracing_time's bad flags, each of which would
otherwise cost a process of its own.
"""

import ast
import dataclasses
import os

from absl import flags as absl_flags
import pytest

from tests import refusals
from tests.binaries import ROOT
from tools import gen_build
from train import config as config_lib
from train import config_fields

MIN_HELP_CHARS = 25
# Help that only restates the flag's name, e.g. "Override of batch_size.".
_PLACEHOLDERS = ("override of",)


def binaries():
  """Module names of train/ and research/ files with a __main__ block."""
  found = []
  for folder in ("train", "research"):
    for name in sorted(os.listdir(os.path.join(ROOT, folder))):
      if not name.endswith(".py"):
        continue
      with open(os.path.join(ROOT, folder, name)) as f:
        if gen_build.has_main_block(ast.parse(f.read())):
          found.append(f"{folder}.{name[:-3]}")
  return found


def problems(helps, config_helps):
  """What is wrong with the help of each flag, one line each.

  Args:
    helps: {defining module: {flag: help}}.
    config_helps: {Config field: its stored help}; the flags that
      train.flags_lib defines for those fields must carry exactly that text.

  Returns:
    A list of "module --flag: what is wrong" lines; empty when all is well.
  """
  found = []
  for module, flag_helps in sorted(helps.items()):
    for flag, text in sorted(flag_helps.items()):
      text = (text or "").strip()
      where = f"{module} --{flag}"
      if len(text) < MIN_HELP_CHARS:
        found.append(f"{where}: help {text!r} is shorter than "
                     f"{MIN_HELP_CHARS} characters")
      if text.lower().startswith(_PLACEHOLDERS):
        found.append(f"{where}: help {text!r} only names the field")
      if "\n" in text:
        found.append(f"{where}: help is not one line")
      if module == "train.flags_lib" and flag in config_helps and (
          text != config_helps[flag]):
        found.append(f"{where}: help {text!r} is not the text stored beside "
                     f"Config.{flag}: {config_helps[flag]!r}")
  return found


def _config_helps():
  return {field.name: config_lib.field_help(field.name)
          for field in config_lib.flat_fields()}


# The binaries whose stray positional argument is run (each one refuses it
# in its own main, through the shared error boundary).
POSITIONAL_BINARIES = ["train.train", "train.evaluate", "train.export",
                       "train.worker", "research.compare",
                       "research.benchmark"]


# Binaries whose main is not behind error_boundary.guard, and why.
UNGUARDED = {
    # Started by the library with positional arguments (a pid, descriptors).
    "train.stop_watchdog",
    # Started by research.user_study with --cell; never by a user.
    "research.user_study_cell",
    # No TensorFlow import: refuses a positional argument itself
    # (tests/test_plot_study.py).
    "research.plot_study",
}


# research.tracing_time's bad flags (flag, what its one error line shows);
# the binary's real run is test_tracing_time.py's (make test-slow).
TRACING_TIME_BAD_FLAGS = [
    ("--model=vgg", "--model='vgg' is invalid"),
    ("--steps_per_loop=1,x", "--steps_per_loop='1,x' is invalid"),
    ("--strategies=2wise,nowise", "--strategies='nowise' is invalid"),
    ("--loops=unrolled,scan", "--loops='unrolled,scan' is invalid"),
    ("--graph_optimizations=none", "--graph_optimizations='none' is "
     "invalid"),
]


@pytest.fixture(scope="module")
def every_binary(tmp_path_factory):
  """(helps, positional, root, tracing_time): {binary: {defining module:
  {flag: help}}} of every binary; {binary: result} of `BINARY stray` for
  each of POSITIONAL_BINARIES (train.train given --model_dir=ROOT/BINARY/run
  too); and {flag: result} of research.tracing_time given each flag of
  TRACING_TIME_BAD_FLAGS; all from one child process."""
  root = tmp_path_factory.mktemp("positional")
  command_lines = {binary: [] for binary in binaries()}
  for binary in POSITIONAL_BINARIES:
    command_lines[binary] = [
        ["stray", f"--model_dir={root / binary / 'run'}"] if (
            binary == "train.train") else ["stray"]]
  bad_flags = [flag for flag, _ in TRACING_TIME_BAD_FLAGS]
  command_lines["research.tracing_time"] = [[flag] for flag in bad_flags]
  results, helps = refusals.run_each_with_helps(command_lines)
  positional = {binary: results[binary][0] for binary in POSITIONAL_BINARIES}
  tracing_time = dict(zip(bad_flags, results["research.tracing_time"]))
  return helps, positional, root, tracing_time


@pytest.fixture
def collected(every_binary):
  return every_binary[0]


def test_every_binary_is_found():
  found = binaries()
  for module in ("train.train", "train.export", "train.evaluate",
                 "train.worker", "research.compare", "research.benchmark",
                 "research.module_costs", "research.collapse_probe"):
    assert module in found


def test_every_config_field_stores_a_help():
  helps = _config_helps()
  assert set(helps) == {f.name for f in config_lib.flat_fields()}
  assert problems({"train.config": helps}, {}) == []


def test_every_flag_of_every_binary_explains_itself(collected):
  assert set(collected) == set(binaries())
  config_helps = _config_helps()
  for binary, helps in collected.items():
    assert problems(helps, config_helps) == [], binary


def test_config_flags_carry_the_stored_help(collected):
  flag_helps = collected["train.train"]["train.flags_lib"]
  config_helps = _config_helps()
  assert {name: flag_helps[name] for name in config_helps} == config_helps
  assert len(flag_helps["preset"]) >= MIN_HELP_CHARS


@pytest.mark.parametrize("binary", POSITIONAL_BINARIES)
def test_a_positional_argument_is_one_line_not_the_usage_text(
    binary, every_binary):
  # `python -m train.train foo`: absl's UsageError would print the whole
  # usage text; the boundary says it in one line, before anything runs.
  _, positional, root, _ = every_binary
  result = positional[binary]
  assert result["code"] == 1
  lines = result["stderr"].strip().splitlines()
  assert len(lines) == 1, result["stderr"]
  assert lines[0].startswith("error: Unexpected arguments: ['stray']"), lines
  assert lines[0].endswith("Received: arguments=['stray']"), lines
  assert not (root / binary / "run").exists()


def test_every_binary_refuses_positional_arguments_before_its_main():
  # A stray word must not start a run: research.cluster_benchmark, whose
  # main had no check of its own, ran its whole benchmark given `stray`
  # and rewrote docs/results. error_boundary.guard refuses it before main.
  unguarded = set()
  for binary in binaries():
    with open(os.path.join(ROOT, *binary.split(".")) + ".py") as f:
      tree = ast.parse(f.read())
    [main] = [node for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name == "main"]
    if not any(ast.unparse(d).startswith("error_boundary.guard(")
               for d in main.decorator_list):
      unguarded.add(binary)
  assert unguarded == UNGUARDED


@pytest.mark.parametrize("flag,shown", TRACING_TIME_BAD_FLAGS)
def test_tracing_time_bad_flags_fail_in_one_line(every_binary, flag, shown):
  result = every_binary[3][flag]
  assert result["code"] == 1
  lines = result["stderr"].strip().splitlines()
  assert len(lines) == 1 and shown in lines[0], result["stderr"]
  assert "Received:" in lines[0]


def test_a_planted_bad_help_is_caught():
  # A placeholder, a terse help and a Config flag whose help drifted from
  # the stored text: each is named.
  fresh = absl_flags.FlagValues()
  absl_flags.DEFINE_integer("batch_size", 1, "Override of batch_size.",
                            flag_values=fresh)
  absl_flags.DEFINE_integer("steps", 1, "Steps.", flag_values=fresh)
  absl_flags.DEFINE_string("seed", "0", "A seed, but not the stored "
                           "help of Config.seed.", flag_values=fresh)
  helps = {"train.flags_lib": {name: fresh[name].help
                               for name in ("batch_size", "steps", "seed")}}
  found = problems(helps, _config_helps())
  assert any(line.startswith("train.flags_lib --batch_size: help "
                             "'Override of batch_size.' only names")
             for line in found), found
  assert any("--steps: help 'Steps.' is shorter" in line
             for line in found), found
  assert any("--seed:" in line and "not the text stored beside Config.seed"
             in line for line in found), found
  assert problems({"m": {"ok": "A help long enough to say what it does."}},
                  {}) == []


def test_a_config_field_without_help_is_refused():
  @dataclasses.dataclass
  class Bare:
    plain: int = 1

  saved = config_fields._FIELDS  # pylint: disable=protected-access
  try:
    config_fields._FIELDS = {  # pylint: disable=protected-access
        f.name: f for f in dataclasses.fields(Bare)}
    with pytest.raises(TypeError, match=r"Config.plain has no help"):
      config_lib.field_help("plain")
  finally:
    config_fields._FIELDS = saved  # pylint: disable=protected-access
