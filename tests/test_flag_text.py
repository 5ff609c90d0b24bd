"""Text flags every binary refuses before anything is written (issue 46).

train/path_flags.py, run by the error boundary before each binary's main:
a control character in any text flag, text that is not UTF-8, a path flag
longer than the file system allows. Each case goes through the binaries'
own mains (flags parsed as absl does, the boundary and all) and checks
that the folder named was not made.
"""

import os

import pytest

from tests.binaries import one_error, run_main

TT = ["--preset=synthetic_mlp", "--train_steps=10"]


def _cases(root):
  """(flag, value, the line's words after "--flag ") for each fault."""
  long_name = os.path.join(root, "n" * 300)
  long_path = os.path.join(root, *["p" * 200] * 21)
  return [
      (f"{root}/a\nb", "contains the control character '\\n'"),
      (f"{root}/tab\there", "contains the control character '\\t'"),
      (f"{root}/esc\x1b[0m", "contains the control character '\\x1b'"),
      (f"{root}/r\udcffn", "is not readable text: it holds bytes b'\\xff' "
       "that are not UTF-8"),
      (long_name, "is too long: its part 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
       "nnnnn'... is 300 bytes, over the file system's limit of 255 for one "
       "name (File name too long, ENAMETOOLONG)"),
      (long_path, f"is too long: it is {len(os.fsencode(long_path))} bytes, "
       f"over the file system's limit of 4095 for a whole path (File name "
       f"too long, ENAMETOOLONG)"),
  ]


@pytest.mark.parametrize("binary,flag,extra", [
    ("train.train", "model_dir", TT),
    ("train.train", "export_dir", [*TT, "--model_dir=RUN"]),
    ("train.export", "model_dir", []),
    ("train.export", "checkpoint", ["--model_dir=RUN"]),
    ("train.evaluate", "saved_model", []),
])
def test_bad_text_in_a_path_flag_is_one_line(binary, flag, extra, tmp_path,
                                            capfd):
  root = str(tmp_path)
  run = os.path.join(root, "run")
  for value, words in _cases(root):
    given = [a.replace("RUN", run) for a in extra]
    code, _, err = run_main(binary, [*given, f"--{flag}={value}"], capfd)
    assert code == 1, (value, err)
    line = one_error(err, f"error: --{flag} {words}", "nothing was written",
                     f"Received: {flag}=")
    assert "\n" not in line and len(line) < 1000, line
    assert not os.listdir(root), (value, os.listdir(root))


def test_a_control_character_in_any_text_flag_is_refused(tmp_path, capfd):
  # Not only paths: a name with a newline is misread wherever it is printed.
  code, _, err = run_main(
      "train.train", [*TT, f"--model_dir={tmp_path}/run",
                      "--strategy=2wise\n"], capfd)
  assert code == 1
  one_error(err, "error: --strategy contains the control character "
            "'\\n'", "Received: strategy='2wise\\n'")
  assert not os.listdir(tmp_path)


def test_a_model_dir_too_long_for_its_export_names_model_dir(tmp_path,
                                                             capfd):
  # The model_dir itself fits, its default export's deepest file does not:
  # the line names the flag the user gave, and keeps the reason.
  model_dir = str(tmp_path)
  while len(model_dir) < 4000:  # 4,000 characters: a whole path is 4,095
    model_dir = os.path.join(model_dir, "d" * min(200, 3999 - len(model_dir)))
  code, _, err = run_main("train.train", [*TT, f"--model_dir={model_dir}"],
                          capfd)
  assert code == 1
  line = one_error(err, "error: --model_dir's default export folder (export "
                   "in it; --export_dir was not given) cannot be written",
                   "is too long", "over the file system's limit of 4096",
                   "pick a shorter path")
  assert len(line) < 2100, len(line)
  assert not os.listdir(tmp_path)
