"""The one place the binaries touch the Python runtime's private names.

A binary stopped by a signal must leave at once (TF's threads would keep
the interpreter waiting), yet still run what was registered to run at exit
(log flushes, temporary files). The standard library has a public way to do
either, not both; the function below names the private one it uses and why.
TF's private names are `tf_interlock.tf_private`'s and Keras's
`tf_interlock.keras_private`'s; tests/test_tf_private.py fails on a private
name anywhere else.
"""

import atexit


def run_exit_functions():
  """Runs the functions registered with `atexit`, last registered first.

  Calls `atexit._run_exitfuncs`, what the interpreter calls at a normal
  exit: `os._exit` (which leaves without waiting for other threads) skips
  them, and `atexit` has no public call that runs them. Each runs once:
  Python clears the list as it runs it.
  """
  atexit._run_exitfuncs()  # pylint: disable=protected-access
