"""One call at a time per model or trainer: a second thread is refused.

Two threads that call `fit` on one `InterlockModel` share its iterator
bookkeeping (`keras_fit.FitLogs.steps_done`), its Keras trackers and its
optimizers' step counters, with no error: each module's optimizer was seen
to count 12 steps where two fits of 8 should give 16. Making the calls
exact would mean serializing whole epochs behind a lock, which hides a
wait of minutes in a thread the user believes runs in parallel; so the
second thread is refused at once, in one line, and the first call goes on
untouched.

The lock is re-entrant: the thread that holds it may call in again
(Keras's `fit` calls `evaluate` for its validation data, and a callback may
call `predict`), and only another thread is refused.
"""

import contextlib
import functools
import threading


class CallGuard:
  """A non-blocking, re-entrant lock that names the call holding it.

  Args:
    owner: the class name the messages use ("InterlockModel").
  """

  def __init__(self, owner):
    self._owner = owner
    self._in_call = threading.RLock()
    self._running = None  # The outermost call holding the lock.
    self._depth = 0

  def __reduce__(self):
    # A lock cannot be copied or pickled; a copied model (`copy.deepcopy`,
    # pickling for a process pool) gets a fresh, free guard of its own.
    return (CallGuard, (self._owner,))

  @contextlib.contextmanager
  def call(self, method):
    """Holds the guard for `method`, or refuses if another thread does.

    Raises:
      RuntimeError: another thread is inside a guarded call.
    """
    name = f"{self._owner}.{method}"
    if not self._in_call.acquire(blocking=False):
      raise RuntimeError(
          f"{self._running} is already running in another thread; one "
          f"{self._owner} runs one call at a time (its optimizers' step "
          f"counters and metrics are shared): wait for that call to return, "
          f"or give each thread its own {self._owner}. Received: {name} "
          f"from thread {threading.current_thread().name!r}")
    try:
      if self._depth == 0:
        self._running = name
      self._depth += 1
      yield
    finally:
      self._depth -= 1
      if self._depth == 0:
        self._running = None
      self._in_call.release()


def guarded(method):
  """Decorates a method of a class with a `_call_guard` attribute."""
  @functools.wraps(method)
  def wrapper(self, *args, **kwargs):
    with self._call_guard.call(method.__name__):  # pylint: disable=protected-access
      return method(self, *args, **kwargs)
  return wrapper
