"""What a study (`research.compare`) may delete: only folders it made itself.

A study's out_dir holds its run folders out_dir/<strategy>/seed_<seed>, each
a `train.train` model_dir, plus logs and reports. An unfinished run is
restarted from scratch (a clean training clock), which deletes what is in
its folder; a user's own run, or one from another study, in the same place
must never be deleted. So every folder compare creates is an owned folder
(`train.owned_dir`, the scheme exports and run directories follow
too), with a marker naming its owner:

* out_dir/compare_study.json: {"owner": <study id>}, written when compare
  claims a new or empty out_dir; a non-empty out_dir without it is refused.
* <run folder>/compare_run.json: {"owner": <study id>, "strategy", "seed"},
  written when compare creates the run folder.

A run folder is reused (finished) or restarted (unfinished) only when its
marker names this study and the same (strategy, seed); anything else is
refused in one line naming the folder, before anything is written. A
restart also takes the run's lock (`train.run_lock`, the lock that
`train.train` holds while it trains), so a live process in the folder is
refused, naming it, and its lock and checkpoints stay where they are.
"""

import contextlib
import time
import uuid

import tensorflow as tf

from train import owned_dir
from train import paths
from train import run_dir as run_dir_lib
from train import run_lock

STUDY_MARKER = "compare_study.json"
# out_dir's lock: one research.compare at a time (see `study_lock`).
STUDY_LOCK = "compare_lock.json"
RUN_MARKER = "compare_run.json"
# A run folder's state, as far as compare is concerned.
NEW, FINISHED, UNFINISHED = "new", "finished", "unfinished"
# What compare adds to a run folder (study_lib's RESULT_FILE, COSTS_FILE), at
# the top and through atomic writes (paths.write_atomic's ".tmp-<8 hex>-"):
# a restart deletes these and what train.train writes
# (`RunDir.foreign_entries`), and refuses if anything else is there.
_COMPARE_WRITES = ("result.json", "module_costs.json")
# What a restart leaves: the run's marker, and its lock (released after).
_KEEP = (run_dir_lib.LOCK, RUN_MARKER)
_MOVE_AWAY = "nothing was changed: move it away or pick a new --out_dir"


def _received(out_dir):
  return f"Received: out_dir={out_dir!r}"


def study_owner(out_dir):
  """The study id in out_dir's marker; None if there is no marker.

  Raises:
    ValueError: out_dir is, or lies under, a file, or its marker is
      unreadable.
  """
  out_dir = paths.normalize(out_dir)
  owned_dir.check_folder_path(out_dir, "--out_dir")
  marker = owned_dir.read_json(paths.join(out_dir, STUDY_MARKER))
  if marker is None:
    return None
  if not isinstance(marker.get("owner"), str):
    raise ValueError(
        f"{paths.join(out_dir, STUDY_MARKER)} is not a research.compare marker "
        f"(a JSON object with a string 'owner'); {_MOVE_AWAY}. "
        f"{_received(out_dir)}")
  return marker["owner"]


def check_unclaimed(out_dir, owner):
  """Raises unless out_dir is compare's (`owner`), new or empty."""
  out_dir = paths.normalize(out_dir)
  if (owner is None and tf.io.gfile.isdir(out_dir) and
      set(tf.io.gfile.listdir(out_dir)) - {STUDY_LOCK}):
    raise ValueError(
        f"--out_dir={out_dir} holds files that research.compare did not write "
        f"(no {STUDY_MARKER}); nothing was changed: pick a new or empty "
        f"directory. {_received(out_dir)}")


@contextlib.contextmanager
def study_lock(out_dir, break_lock=False):
  """Holds out_dir's lock (STUDY_LOCK): one compare at a time.

  A second compare started into the same out_dir is refused in one line
  before it writes anything. out_dir is made for the lock when missing,
  and removed again on the way out if nothing else was written.

  Raises:
    ValueError: naming the live compare that holds out_dir.
  """
  out_dir = paths.normalize(out_dir)
  with run_lock.held(out_dir, STUDY_LOCK, break_lock, refused=(
      f"--out_dir={out_dir} is in use by another research.compare: ")):
    yield


def claim(out_dir, owner):
  """Makes out_dir this study's (a new id if `owner` is None); the id."""
  if owner is not None:
    return owner
  out_dir = paths.normalize(out_dir)
  owner = uuid.uuid4().hex
  if not owned_dir.create_marker(out_dir, STUDY_MARKER, {
      "owner": owner, "made_by": "research.compare",
      "created": time.time()}):
    raise ValueError(f"another research.compare claimed --out_dir={out_dir} "
                     f"just now; nothing was changed. {_received(out_dir)}")
  return owner


def _owns_run(run_dir, owner, strategy, seed):
  return owned_dir.names(owned_dir.read_marker(run_dir, RUN_MARKER),
                         owner=owner, strategy=strategy, seed=seed)


def _holder(run_dir):
  """', in use by pid P on host H (its lock.json)' if a lock names one."""
  lock = owned_dir.read_json(paths.join(run_dir, run_dir_lib.LOCK))
  if not lock or "pid" not in lock:
    return ""
  return (f", in use by pid {lock.get('pid')} on host {lock.get('host')} "
          f"(its {run_dir_lib.LOCK})")


def run_state(out_dir, run_dir, owner, strategy, seed, result_file):
  """NEW, FINISHED or UNFINISHED; raises for a folder not of this study.

  Reads only.

  Args:
    out_dir: the study's --out_dir (for messages).
    run_dir: out_dir/<strategy>/seed_<seed>.
    owner: this study's id, or None for a study not begun yet.
    strategy: the strategy's name; seed: the run's seed.
    result_file: the name of a finished run's result in run_dir.

  Raises:
    ValueError: naming the folder, when it (or a file above it) is not
      this study's run of `strategy` and `seed`.
  """
  blocker = paths.file_above(run_dir)
  if blocker is not None:
    raise ValueError(f"{blocker} is a file where compare needs the folder "
                     f"{run_dir}; {_MOVE_AWAY}. {_received(out_dir)}")
  if not tf.io.gfile.exists(run_dir):
    return NEW
  if not _owns_run(run_dir, owner, strategy, seed):
    raise ValueError(
        f"{run_dir} holds a run that this research.compare study did not make "
        f"(no {RUN_MARKER} naming it){_holder(run_dir)}; {_MOVE_AWAY}. "
        f"{_received(out_dir)}")
  if tf.io.gfile.exists(paths.join(run_dir, result_file)):
    return FINISHED
  check_restartable(out_dir, run_dir)
  return UNFINISHED


def check_restartable(out_dir, run_dir):
  """Raises unless emptying the unfinished run `run_dir` deletes only what
  train.train and compare wrote there; reads only.

  Refused: a symbolic link on the way from out_dir or anywhere inside
  (a linked train/ would be emptied through), and an entry at any depth
  that neither binary writes (`RunDir.foreign_entries`: a user's
  checkpoints/README.txt).

  Raises:
    ValueError: naming the link or the foreign entries.
  """
  owned_dir.check_contained(out_dir, run_dir, _received(out_dir))
  foreign = run_dir_lib.RunDir(run_dir).foreign_entries(
      also_ours=_KEEP + _COMPARE_WRITES)
  if foreign:
    raise ValueError(
        f"{run_dir} holds files that neither train.train nor "
        f"research.compare writes ({', '.join(foreign)}); {_MOVE_AWAY}. "
        f"{_received(out_dir)}")


def check_not_in_use(run_dir, break_lock=False):
  """Raises ValueError naming the holder if a live process holds run_dir.

  Takes the run's lock and gives it back: a lock left by a dead process is
  taken over (with a warning) and so removed; a live one is left alone.
  """
  with run_lock.held(run_dir, run_dir_lib.LOCK, break_lock):
    pass


def prepare(out_dir, run_dir, owner, strategy, seed, break_lock=False):
  """Readies a run folder for train.train to start from scratch.

  Under the run's lock: a new folder gets this study's marker; an
  unfinished run of this study is emptied of what train.train and compare
  write, all but its marker (and the lock, released on return); anything
  else there, at any depth (`RunDir.foreign_entries`: a user's notes in
  checkpoints/), or a symbolic link on the way or inside, is refused.

  Args:
    out_dir: the study's --out_dir (for messages).
    run_dir: out_dir/<strategy>/seed_<seed>.
    owner: this study's id; strategy, seed: the run's.
    break_lock: take over a lock although its holder looks alive.

  Raises:
    ValueError: a live process holds the run, the folder turned out not
      to be this study's, or it holds files neither train.train nor compare
      writes; nothing was deleted then.
  """
  with run_lock.held(run_dir, run_dir_lib.LOCK, break_lock):
    entries = [e.rstrip("/") for e in tf.io.gfile.listdir(run_dir)]
    if _owns_run(run_dir, owner, strategy, seed):
      check_restartable(out_dir, run_dir)  # again, under the lock
      owned_dir.clear(run_dir, _KEEP)
    elif not (entries == [run_dir_lib.LOCK] and owned_dir.create_marker(
        run_dir, RUN_MARKER,
        {"owner": owner, "strategy": strategy, "seed": seed})):
      # Someone else's files arrived since the checks: leave them.
      raise ValueError(
          f"{run_dir} holds a run that this research.compare study did not "
          f"make (no {RUN_MARKER} naming it); {_MOVE_AWAY}. "
          f"{_received(out_dir)}")
