"""The profiler times an op on the cores the schedule model lets it hold.

`profiling.holding_cores` pins every thread of the process for the timed
calls, and gives each thread its own affinity back afterwards (Linux's
affinity calls; CI runs on Linux).
"""

import os
import threading

import pytest

from step_model import profiling

def _affinities():
  found = {}
  for tid in os.listdir("/proc/self/task"):
    try:
      found[int(tid)] = os.sched_getaffinity(int(tid))
    except OSError:
      pass
  return found


@pytest.fixture(name="other_thread")
def fixture_other_thread():
  """A second thread, pinned to the process's last core (its own mask)."""
  release, ready, tid = threading.Event(), threading.Event(), []

  def run():
    tid.append(threading.get_native_id())
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    ready.set()
    release.wait()

  thread = threading.Thread(target=run)
  thread.start()
  ready.wait()
  yield tid[0]
  release.set()
  thread.join()


def test_every_thread_is_pinned_and_gets_its_own_mask_back(other_thread):
  before = _affinities()
  assert before[other_thread] == {max(os.sched_getaffinity(0))}
  with profiling.holding_cores(1) as chosen:
    inside = _affinities()
  assert chosen == (min(os.sched_getaffinity(0)),)
  assert len(inside) >= 2 and other_thread in inside
  assert all(mask == set(chosen) for mask in inside.values())
  after = _affinities()
  assert {tid: after[tid] for tid in before} == before


def test_more_cores_than_the_process_has_pins_all_of_them():
  process = os.sched_getaffinity(0)
  with profiling.holding_cores(len(process) + 3) as chosen:
    assert os.sched_getaffinity(0) == process
  assert chosen == tuple(sorted(process))


def test_only_the_timed_calls_are_pinned():
  seen = []

  def fn():
    seen.append(len(os.sched_getaffinity(0)))
    return []

  profiling._median_time(fn, repeats=3, cores=1)  # pylint: disable=protected-access
  cores = len(os.sched_getaffinity(0))
  # Two warm-up calls on the process's cores, one on the pinned core, then
  # the three timed ones there.
  assert seen == [cores, cores, 1, 1, 1, 1]


@pytest.mark.parametrize("cores", [0, -1, 1.0, True, None])
def test_cores_must_be_a_positive_int(cores):
  with pytest.raises(ValueError, match=rf"Received: cores={cores!r}$"):
    with profiling.holding_cores(cores):
      pass
