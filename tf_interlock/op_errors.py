"""TF runtime errors with their cause on the first line.

An op that fails inside a `tf.function` (Keras's train, test and predict
functions) raises a `tf.errors.OpError` whose text starts "Graph execution
error:", then the Python trace of the node, and only then the kernel's own
message: "Received a label value of 7 which is outside the valid range of
[0, 3)", or the exception a `Dataset.from_generator` generator raised. A
user reading the first line learns nothing. `cause_first` re-raises such an
error, of the same class, with the kernel's message first and the whole
original text below it.
"""

import contextlib
import re

import tensorflow as tf

# Lines of TF's wrapper text, not the kernel's message.
_WRAPPER_PREFIXES = ("Graph execution error:", "Detected at node",
                     "<stack traces unavailable>",
                     "Traceback (most recent call last):", "[[")


def kernel_message(text):
  """The first line of the failing kernel's own message in `text`.

  Skips TF's "Graph execution error:" header, the "Detected at node"
  traces (indented lines) and the "{{function_node ...}}" prefix.

  Args:
    text: an `OpError`'s message.

  Returns:
    The line, stripped; the first non-empty line when every line is
    wrapper text; "" for an empty text.
  """
  lines = [line for line in str(text).splitlines() if line.strip()]
  kept = [line for line in lines
          if not line[0].isspace() and
          not line.strip().startswith(_WRAPPER_PREFIXES)]
  line = (kept or lines or [""])[0].strip()
  return re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line)


@contextlib.contextmanager
def cause_first(where):
  """Re-raises a `tf.errors.OpError` with the kernel's message first.

  Args:
    where: what was running, for the first line (e.g. "fit").

  Yields:
    Nothing; the body runs as is.

  Raises:
    tf.errors.OpError: of the class raised, as "<kernel message> (raised
      in <where>)" followed by TF's whole text.
  """
  try:
    yield
  except tf.errors.OpError as e:
    cause = kernel_message(e.message)
    if not cause or e.message.startswith(cause):
      raise
    text = f"{cause} (raised in {where})\n\n{e.message}"
    if type(e) is tf.errors.OpError:  # pylint: disable=unidiomatic-typecheck
      raise tf.errors.OpError(e.node_def, e.op, text, e.error_code) from None
    raise type(e)(e.node_def, e.op, text) from None
