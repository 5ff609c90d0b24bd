"""One-line faults of issue 29: a symlink-loop folder, a full disk, a
flag advice that says what a
value must be."""

import pytest
import tensorflow as tf

from train import error_boundary
from train import flags_lib


def test_a_symlink_loop_says_so(tmp_path):
  (tmp_path / "a").symlink_to(tmp_path / "b")
  (tmp_path / "b").symlink_to(tmp_path / "a")
  with pytest.raises(tf.errors.OpError) as e:
    tf.io.gfile.makedirs(str(tmp_path / "a" / "run"))
  line = error_boundary.describe(e.value)
  assert "Too many levels of symbolic links" in line
  assert line.endswith("(a symlink loop: fix the link or pick another "
                       "folder)")


def test_a_full_disk_says_the_checkpoints_are_intact():
  error = tf.errors.ResourceExhaustedError(
      None, None, "/runs/x/export/variables/variables.data-00000-of-00001; "
      "No space left on device")
  line = error_boundary.describe(error)
  assert line.startswith("ResourceExhaustedError: /runs/x/export/")
  assert "checkpoints written before are intact" in line


@pytest.mark.parametrize("name, text, advice", [
    ("num_modules", "four", "a whole number in digits, such as "
     "--num_modules=4"),
    ("seed", "None", "a whole number in digits, such as --seed=0"),
    ("deterministic", "maybe", "true or false"),
])
def test_flag_advice_says_what_is_allowed(name, text, advice):
  field = next(f for f in flags_lib.config_lib.Config.flat_fields()
               if f.name == name)
  with pytest.raises(ValueError) as e:
    flags_lib._parse(field, text)  # pylint: disable=protected-access
  assert advice in str(e.value)
  assert str(e.value).endswith(f"Received: {name}={text!r}")
