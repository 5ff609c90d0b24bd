"""`RunDir`: the one place that knows the layout of a training run directory.

    model_dir/
      config.json        the run's configuration (written at each start)
      run.json           the run's id: its owner marker (`owned_dir`)
      lock.json          held by the process writing it (`run_lock`)
      checkpoints/       tf.train.CheckpointManager: ckpt-N.*, "checkpoint"
      train/ eval/       TensorBoard event files
      export/            the default SavedModel target (marked, see export)

Every function reads before it writes and raises a one-line `ValueError`
naming the path at fault; all file access goes through `tf.io.gfile`, so
model_dir may be a local folder, gs:// or ram://. Only the binaries
(train/, research/) read run directories, so this lives with them; so do
the path check only they make, `check_literal`.
"""

import os
import re
import time
import uuid

from google.protobuf import text_format
import tensorflow as tf

from tf_interlock import export as export_lib
from tf_interlock import tf_private
from train import export_dir as export_dir_lib
from train import owned_dir
from train import paths

CONFIG = "config.json"
RUN_INFO = "run.json"
LOCK = "lock.json"
CHECKPOINTS = "checkpoints"
TRAIN_LOGS = "train"
EVAL_LOGS = "eval"
EXPORT = "export"
POINTER = "checkpoint"  # tf.train.CheckpointManager's index of checkpoints
_CKPT = re.compile(r"^ckpt-(\d+)\.(index|data-(\d+)-of-(\d+))$")
# What train.train writes below model_dir, at every depth (`foreign_entries`
# refuses anything else): atomic writes' ".tmp-<8 hex>-<name>"
# (paths.write_atomic), TF's "checkpoint.tmp<32 hex>", a save's ckpt-N_temp/,
# TensorBoard's event files and profiles and an export's temporary siblings.
_WRITTEN_BELOW = {
    "": re.compile(r"^(\.tmp-[0-9a-f]{8}-)?(config\.json|run\.json|"
                   r"lock\.json|checkpoints|train|eval|export)$|"
                   r"^\.export\.(tmp|old)-[0-9a-f]{12}(/.*)?$"),
    CHECKPOINTS: re.compile(
        r"^(\.tmp-[0-9a-f]{8}-checkpoint|checkpoint(\.unreadable|"
        r"\.tmp[0-9a-f]{32})?|ckpt-\d+\.(index|data-\d+-of-\d+)|"
        r"ckpt-\d+_temp(/.*)?)$"),
    # --profile_steps: plugins/profile/<time>/<host>.xplane.pb
    TRAIN_LOGS: re.compile(r"^events\.out\.tfevents\.[^/]+$|"
                           r"^plugins(/profile(/[^/]+(/[^/]+)?)?)?$"),
    EVAL_LOGS: re.compile(r"^events\.out\.tfevents\.[^/]+$"),
}


is_within = paths.is_within


# TF reads a checkpoint prefix (and a SavedModel's variables) as a file
# pattern: "run[1]" matches "run1", never itself. One rule with the
# library's export (`tf_interlock.export.PATTERN_CHARS`).
GLOB_CHARS = export_lib.PATTERN_CHARS


def check_literal(path, name="--model_dir"):
  """Raises unless `path` is free of the characters TF reads as a pattern.

  A run folder named `sweep[lr=0.1]` saves checkpoints that TF can never
  restore, so such a name is refused before anything is written.

  Args:
    path: a local path or URL.
    name: the flag that set it, for the message.

  Raises:
    ValueError: naming the path and the characters at fault.
  """
  bad = export_lib.pattern_chars(path)
  if bad:
    kept = (" (its files are intact: rename the folder to resume or export "
            "it)" if tf.io.gfile.exists(path) else "")
    raise ValueError(
        f"{name}={path} contains {bad!r}, which TensorFlow reads as a file "
        f"pattern when it restores a checkpoint or loads a SavedModel, so "
        f"the run could be saved but never resumed; nothing was written"
        f"{kept}: use a name without {' '.join(GLOB_CHARS)}. Received: "
        f"{name.lstrip('-')}={os.fspath(path)!r}")


# TF's file systems whose files live in this process's memory only.
IN_MEMORY_SCHEMES = ("ram",)


def check_lasting(path, name):
  """Raises if `path` would vanish with the process (ram://).

  A binary's run, export or study must outlive it: on ram:// it would
  exit 0, report where they are, and lose them (a rerun starts from
  scratch). The library itself takes ram:// (tests use it for gs://).

  Args:
    path: a local path or URL, or None (nothing to check).
    name: the flag that set it, e.g. "--model_dir".

  Raises:
    ValueError: naming the flag and what is allowed.
  """
  if path and os.fspath(path).split("://", 1)[0].lower() in (
      IN_MEMORY_SCHEMES) and paths.is_url(os.fspath(path)):
    raise ValueError(
        f"{name}={path} is in this process's memory, which is lost when the "
        f"binary exits: nothing was written; use a local folder or a "
        f"lasting file system such as gs://. Received: "
        f"{name.lstrip('-')}={os.fspath(path)!r}")


class RunDir:
  """Paths and checked reads/writes of one run directory.

  Args:
    path: the model_dir (local path or URL).
    name: how errors name it, e.g. "--model_dir".
  """

  def __init__(self, path, name="--model_dir"):
    self.path = paths.normalize(path)
    self.name = name
    check_literal(self.path, name)
    self._received = f"Received: {name.lstrip('-')}={self.path!r}"

  def file(self, *parts):
    return paths.join(self.path, *parts)

  @property
  def config_path(self):
    return self.file(CONFIG)

  @property
  def checkpoint_dir(self):
    return self.file(CHECKPOINTS)

  @property
  def train_log_dir(self):
    return self.file(TRAIN_LOGS)

  @property
  def eval_log_dir(self):
    return self.file(EVAL_LOGS)

  @property
  def default_export_dir(self):
    return self.file(EXPORT)

  @property
  def lock_path(self):
    return self.file(LOCK)

  def exists(self):
    return tf.io.gfile.isdir(self.path)

  def check_layout(self):
    """Raises if model_dir or one of its known entries has the wrong type,
    or if model_dir cannot be reached (a gs:// bucket with no network)."""
    try:  # the binaries' first access to the run directory
      owned_dir.check_folder_path(self.path, self.name)
    except tf.errors.NotFoundError:
      raise
    except tf.errors.OpError as e:
      status = (e.message or "").strip().splitlines() or [""]
      raise ValueError(f"{self.name}={self.path}: cannot reach it "
                       f"({type(e).__name__}: {status[0].strip()})"
                       ) from None
    # (The export target is checked by `check_export_dir`.)
    for entry, want_dir in ((CHECKPOINTS, True), (TRAIN_LOGS, True),
                            (EVAL_LOGS, True), (CONFIG, False),
                            (RUN_INFO, False), (LOCK, False)):
      path = self.file(entry)
      if tf.io.gfile.exists(path) and tf.io.gfile.isdir(path) != want_dir:
        kind = "a directory" if want_dir else "a file"
        raise ValueError(f"{path} should be {kind} of the run directory; "
                         f"nothing was changed. {self._received}")
    # A run deletes and replaces entries of these (old checkpoints, a save
    # killed midway, the export): none may lead out of model_dir, e.g. a
    # checkpoints/ linked to another run's, whose files it would delete.
    for entry in (CHECKPOINTS, TRAIN_LOGS, EVAL_LOGS, EXPORT, CONFIG,
                  RUN_INFO, LOCK, *self._unfinished_checkpoints()):
      self._check_contained(self.file(entry))

  def _check_contained(self, path):
    """`owned_dir.check_contained` within model_dir, naming the flag."""
    owned_dir.check_contained(self.path, path, self._received)

  def check_nesting(self):
    """Raises if model_dir is or lies inside an export, another run or a
    checkpoints/ folder.

    Whatever owns that folder would delete or overwrite this run: a new
    export of the outer run replaces its export folder, and a checkpoint
    manager deletes old ckpt-N files next to it. Reads only.
    """
    if tf.io.gfile.exists(self.file(export_dir_lib.MARKER)):
      raise ValueError(f"{self.name}={self.path} is an export "
                       f"({export_dir_lib.MARKER}), not a run directory; "
                       f"nothing was changed: pick another folder. "
                       f"{self._received}")
    current = self.path
    while True:
      up = paths.parent(current)
      if up == current or up.endswith("://") or up == "":
        return
      current = up
      if tf.io.gfile.exists(paths.join(current, export_dir_lib.MARKER)):
        owner = f"the export {current}"
      elif tf.io.gfile.exists(paths.join(current, RUN_INFO)) or (
          tf.io.gfile.exists(paths.join(current, CONFIG)) and
          tf.io.gfile.isdir(paths.join(current, CHECKPOINTS))):
        owner = f"the run {current}"
      elif paths.basename(current) == CHECKPOINTS and tf.io.gfile.exists(
          paths.join(current, POINTER)):
        owner = f"the checkpoints folder {current}"
      else:
        continue
      raise ValueError(f"{self.name}={self.path} lies inside {owner}, which "
                       f"would overwrite or delete it; nothing was changed: "
                       f"pick a folder outside it. {self._received}")

  def foreign_entries(self, also_ours=()):
    """What model_dir holds, at any depth, that train.train did not write.

    Args:
      also_ours: further top-level names that are not foreign (e.g. the
        files research.compare adds to a run folder), nor their atomic
        writes' temporaries.

    Returns:
      Sorted paths relative to model_dir.
    """
    export = self.default_export_dir
    marker = export_dir_lib.read_marker(export)
    in_export = (set() if marker is None else
                 set(export_dir_lib.foreign_entries(export, marker)))

    def ours(rel):
      top, _, below = rel.partition("/")
      if re.sub(r"^\.tmp-[0-9a-f]{8}-", "", top) in also_ours:
        return True
      if top == EXPORT and below:
        return marker is not None and below not in in_export
      rule = _WRITTEN_BELOW.get(top) if below else None
      return bool(rule.match(below) if rule else _WRITTEN_BELOW[""].match(rel))

    return owned_dir.foreign_entries(self.path, ours, recursive=True)

  def _read_json(self, path, fields=None):
    try:
      return owned_dir.load_json(path, fields)
    except ValueError as e:
      raise ValueError(f"{path} {e}; nothing was changed: repair, replace "
                       f"or move it away. {self._received}") from None

  def _write_atomic(self, path, text):
    """Writes `text` to `path` atomically, making the run folder if needed."""
    tf.io.gfile.makedirs(self.path)
    paths.write_atomic(path, text)

  def read_config(self):
    """config.json as a dict, or None in a new run directory."""
    if not tf.io.gfile.exists(self.config_path):
      return None
    saved = self._read_json(self.config_path)
    history = saved.get("history", [])  # earlier starts' changes (train_lib)
    if not isinstance(history, list) or not all(
        isinstance(entry, dict) for entry in history):
      raise ValueError(f"{self.config_path} has history={str(history)[:60]!r}"
                       f", which must be a list of objects; nothing was "
                       f"changed: repair or move it. {self._received}")
    return saved

  def write_config(self, text):
    self._write_atomic(self.config_path, text)

  def check_same(self, current, fields, why):
    """Raises if config.json differs from `current` in one of `fields`.

    Args:
      current: the new run's configuration as a dict.
      fields: names that must match.
      why: what a mismatch would break, for the message.
    """
    saved = self.read_config()
    if saved is None:
      return
    for field in fields:
      if saved.get(field) != current.get(field):
        raise ValueError(
            f"{self.name}={self.path} holds a run with {field}="
            f"{saved.get(field)!r} ({why}); use a new model_dir or "
            f"--{field}={saved.get(field)}. Received: {field}="
            f"{current.get(field)!r}")

  def run_id(self, create=False):
    """The run's id (run.json), made on first use if `create`."""
    path = self.file(RUN_INFO)
    if tf.io.gfile.exists(path):
      return self._read_json(path, {"run_id": str})["run_id"]
    if not create:
      return None
    run_id = uuid.uuid4().hex
    if not owned_dir.create_marker(self.path, RUN_INFO, {
        "run_id": run_id, "created": time.time()}):
      return self.run_id()  # another process made it just now
    return run_id

  def check_export_dir(self, export_dir, name="--export_dir"):
    """Raises unless a training export to `export_dir` loses nothing.

    Args:
      export_dir: the target; None means the default, model_dir/export.
      name: the flag that set it.

    Returns:
      The normalized export path.
    """
    target = paths.normalize(export_dir or self.default_export_dir)
    check_literal(target, name)
    received = f"Received: {name.lstrip('-')}={target!r}"
    if is_within(self.path, target):
      raise ValueError(f"{name}={target} is model_dir or a folder above "
                       f"it: the export would replace the run directory "
                       f"{self.path}; use a separate directory. {received}")
    for entry in (CHECKPOINTS, TRAIN_LOGS, EVAL_LOGS, CONFIG, RUN_INFO, LOCK):
      if is_within(target, self.file(entry)):
        raise ValueError(f"{name}={target} lies in the run's {entry}; use "
                         f"model_dir/{EXPORT} or a separate directory. "
                         f"{received}")
    try:
      export_dir_lib.check_export_target(target, self.run_id(), name=name)
    except ValueError as e:
      if export_dir:
        raise
      # The user named no export folder: name the flag they gave.
      raise ValueError(
          f"--model_dir's default export folder ({EXPORT} in it; "
          f"--export_dir was not given) cannot be written: {e}") from None
    return target

  def complete_checkpoints(self):
    """Steps N whose ckpt-N index and every data shard are present."""
    if not tf.io.gfile.isdir(self.checkpoint_dir):
      return []
    found = {}
    for name in tf.io.gfile.listdir(self.checkpoint_dir):
      match = _CKPT.match(name)
      if match:
        entry = found.setdefault(int(match.group(1)), [False, set(), None])
        if match.group(2) == "index":
          entry[0] = True
        else:
          entry[1].add(int(match.group(3)))
          entry[2] = int(match.group(4))
    return sorted(n for n, (index, shards, total) in found.items()
                  if index and total and shards == set(range(total)))

  def _pointer_problem(self):
    """(None, prefix) for a usable pointer, else (problem, None)."""
    path = self.file(CHECKPOINTS, POINTER)
    if not tf.io.gfile.exists(path):
      return "is missing", None
    if paths.special_kind(path) is not None:
      return f"is {paths.special_kind(path)}, not a regular file", None
    try:
      with tf.io.gfile.GFile(path, "rb") as f:
        state = text_format.Parse(f.read().decode("utf-8"),
                                  tf_private.checkpoint_state())
    except (UnicodeDecodeError, text_format.ParseError, tf.errors.OpError):
      return "is unreadable", None
    outside = [entry for entry in [state.model_checkpoint_path,
                                   *state.all_model_checkpoint_paths]
               if entry and paths.parent(paths.join(
                   self.checkpoint_dir, entry)) != self.checkpoint_dir]
    if outside:
      # TF's CheckpointManager deletes the oldest listed prefixes, wherever
      # they are: an entry out of checkpoints/ would delete files there.
      raise ValueError(
          f"{path} lists {outside[0]!r}, which lies outside "
          f"{self.checkpoint_dir}: keeping only the newest checkpoints "
          f"would delete files there; nothing was changed: remove that "
          f"entry from the file (or the file, then resume with "
          f"--resume_from=ckpt-N). {self._received}")
    prefix = state.model_checkpoint_path
    if not prefix:
      return "names no checkpoint", None
    name = paths.basename(prefix)
    match = re.fullmatch(r"ckpt-(\d+)", name)
    if not match or int(match.group(1)) not in self.complete_checkpoints():
      return f"names {prefix}, which is incomplete or missing", None
    return None, self.file(CHECKPOINTS, name)

  def latest_checkpoint(self, select=None, flag="--resume_from",
                        for_writing=True):
    """The checkpoint to resume from, or None for a fresh start.

    A run whose checkpoint data outlived a usable "checkpoint" pointer is
    not restarted silently (that would overwrite ckpt-N files): the error
    names the newest complete checkpoint and the flag that selects it.

    Args:
      select: "ckpt-N" to use explicitly, or None for the pointer's.
      flag: the flag that sets `select`, for messages.
      for_writing: training will save after it, so a selected checkpoint
        older than the newest complete one (which would be overwritten) is
        refused.

    Returns:
      A checkpoint prefix, or None. Writes nothing (see `repair_pointer`).
    """
    complete = self.complete_checkpoints()
    has_data = tf.io.gfile.isdir(self.checkpoint_dir) and any(
        _CKPT.match(n) for n in tf.io.gfile.listdir(self.checkpoint_dir))
    pointer = self.file(CHECKPOINTS, POINTER)
    problem, latest = (self._pointer_problem() if has_data or
                       tf.io.gfile.exists(pointer) else (None, None))
    if select is not None:
      received = f"Received: {flag.lstrip('-')}={select!r}"
      match = re.fullmatch(r"ckpt-(\d+)", select)
      # TF names a checkpoint ckpt-<step> exactly: "ckpt-010" is no file,
      # even when ckpt-10 is one.
      if select not in [f"ckpt-{n}" for n in complete]:
        raise ValueError(self._no_checkpoint(select, flag, complete) +
                         f" {received}")
      newer = [n for n in complete if n > int(match.group(1))]
      if newer and for_writing:
        raise ValueError(
            f"{flag}={select} would overwrite the newer checkpoint "
            f"ckpt-{newer[-1]} in {self.checkpoint_dir}; move it away "
            f"first. {received}")
      return self.file(CHECKPOINTS, select)
    if problem is None:
      return latest
    hint = (f"use the newest complete one with {flag}=ckpt-{complete[-1]}"
            if complete else "no complete ckpt-N was found: move "
            "checkpoints/ away to start over")
    raise ValueError(f"{pointer} {problem} but {self.checkpoint_dir} holds "
                     f"checkpoint data; nothing was changed: {hint}. "
                     f"{self._received}")

  def _no_checkpoint(self, select, flag, complete):
    """Why `select` names no complete checkpoint, and what the run has."""
    has = ", ".join(f"ckpt-{n}" for n in complete) or "none"
    match = re.fullmatch(r"ckpt-0*(\d+)", select)
    if match and int(match.group(1)) in complete:
      why = (f"no checkpoint {select} in {self.checkpoint_dir} (did you "
             f"mean ckpt-{int(match.group(1))}?)")
    elif match and tf.io.gfile.isdir(self.checkpoint_dir) and any(
        n.startswith(select + ".") for n in
        tf.io.gfile.listdir(self.checkpoint_dir)):
      why = (f"checkpoint {select} in {self.checkpoint_dir} is incomplete "
             f"(its index or a data shard is missing)")
    else:
      why = f"no checkpoint {select} in {self.checkpoint_dir}"
    return (f"{flag}={select}: {why}; nothing was changed; the run has: "
            f"{has}.")

  def _unfinished_checkpoints(self):
    """checkpoints/ckpt-N_temp entries, as paths relative to model_dir."""
    if not tf.io.gfile.isdir(self.checkpoint_dir):
      return []
    return sorted(paths.join(CHECKPOINTS, n.rstrip("/")) for n in
                  tf.io.gfile.listdir(self.checkpoint_dir)
                  if re.fullmatch(r"ckpt-\d+_temp/?", n))

  def remove_unfinished_checkpoints(self):
    """Deletes the `ckpt-N_temp` folders a failed save left (TF writes a
    checkpoint there, then moves its files out); returns their names.
    Each is checked first (`owned_dir.check_contained`): a link is refused,
    never followed."""
    names = self._unfinished_checkpoints()
    for name in names:
      self._check_contained(self.file(name))
    for name in names:
      owned_dir.remove(self.path, self.file(name))
    return [paths.basename(name) for name in names]

  def repair_pointer(self, prefix):
    """Points "checkpoint" at `prefix` (after `latest_checkpoint` allowed
    it); an unreadable old pointer is kept as "checkpoint.unreadable"."""
    pointer = self.file(CHECKPOINTS, POINTER)
    if self._pointer_problem()[1] == prefix:
      return
    if tf.io.gfile.exists(pointer):
      for path in (pointer, pointer + ".unreadable"):
        self._check_contained(path)
      tf.io.gfile.rename(pointer, pointer + ".unreadable", overwrite=True)
    step = int(paths.basename(prefix).split("-")[1])
    kept = [f"ckpt-{n}" for n in self.complete_checkpoints() if n <= step]
    state = tf_private.checkpoint_state(
        model_checkpoint_path=paths.basename(prefix),
        all_model_checkpoint_paths=kept)
    self._write_atomic(pointer, text_format.MessageToString(state))
