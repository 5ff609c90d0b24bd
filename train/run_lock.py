"""One process per folder: a lock file with its holder's identity.

The lock half of the ownership scheme (`train.owned_dir`): a marker
says whose a folder is, the lock says who writes it now. `train.train` and
`train.export` hold model_dir/lock.json, `research.compare` its out_dir's
compare_lock.json and each run folder's lock.json (`held`).

Two runs writing one model_dir (say, started twice with different seeds)
would silently overwrite each other's checkpoints. `RunLock` writes
model_dir/lock.json holding host, pid, start time and a heartbeat time, via
`tf.io.gfile` (so it works on gs:// and ram://, which have no file locks).

A lock is stale, and taken over with a warning, when its holder is a dead
process on this host, or its heartbeat is older than `stale_after_s` (a
holder on another host cannot be probed). Otherwise the second run is
refused, naming the holder, unless told to break the lock.

On a local folder the holder also keeps the run directory itself open with
an exclusive `fcntl.flock`, which the kernel drops when the process dies:
a second writer is refused while the holder lives even if lock.json was
deleted, and no flag breaks it. gs:// and ram:// have no such lock; there
lock.json alone decides. Either way `verify` (before each checkpoint save)
stops a holder whose lock.json no longer carries its token, or whose folder
was moved or replaced.
"""

import contextlib
import datetime
import errno
import fcntl
import json
import math
import os
import socket
import sys
import time
import uuid

import tensorflow as tf

from train import owned_dir
from train import paths

STALE_AFTER_S = 3600.0


class LockLost(RuntimeError):
  """The holder's lock was taken, deleted, or its folder moved away."""


def _alive(pid):
  """Whether process `pid` of this host may exist: False for a number no
  process can have (a lock file may hold anything), True for a pid that is
  not a number at all (unknown: only --break_lock takes such a lock)."""
  if isinstance(pid, bool) or not isinstance(pid, int):
    return True
  if pid <= 0:  # os.kill would probe a process group instead
    return False
  try:
    os.kill(pid, 0)
  except (ProcessLookupError, OverflowError):
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


def _seconds(value):
  """A lock's time field as a finite float, or None if it is not one."""
  if isinstance(value, bool):
    return None
  try:
    seconds = float(value)
  except (TypeError, ValueError, OverflowError):
    return None
  return seconds if math.isfinite(seconds) else None


def _when(value):
  """A lock's time field for messages, whatever the file holds."""
  seconds = _seconds(value)
  try:
    return datetime.datetime.fromtimestamp(
        seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
  except (TypeError, ValueError, OverflowError, OSError):
    return f"an unreadable time ({str(value)[:40]!r})"


class RunLock:
  """The lock of one run directory.

  Args:
    path: the lock file (model_dir/lock.json).
    break_flag: the flag that breaks a live lock, for messages.
    stale_after_s: heartbeat age after which another host's lock is stale.
    out: where take-over warnings go (default: sys.stderr).
  """

  def __init__(self, path, break_flag="--break_lock",
               stale_after_s=STALE_AFTER_S, out=None):
    self.path = path
    self.break_flag = break_flag
    self.stale_after_s = stale_after_s
    self.out = out
    self.held = False
    self._fd = None  # the run directory, flock-ed (local folders only)
    self._identity = None  # its os.fstat when locked
    now = time.time()
    self.info = {"host": socket.gethostname(), "pid": os.getpid(),
                 "started": now, "updated": now, "token": uuid.uuid4().hex}

  def _read(self):
    """The holder's info, None without a lock, {} for an unreadable one."""
    return owned_dir.read_json(self.path)

  def _write(self, overwrite):
    paths.write_atomic(self.path, json.dumps(self.info, sort_keys=True),
                       overwrite=overwrite)

  def _stale_reason(self, holder):
    """Why `holder`'s lock may be taken over, or None."""
    if not holder:
      return None
    if holder.get("host") == self.info["host"]:
      pid = holder.get("pid")
      if pid != os.getpid() and not _alive(pid):
        return f"its process {str(pid)[:40]} on this host is gone"
      return None
    updated = _seconds(holder.get("updated", 0))
    if updated is None:
      return None  # no readable heartbeat: only --break_lock takes it
    age = time.time() - updated
    if age > self.stale_after_s:
      return f"no heartbeat for {age:.0f} s"
    return None

  def acquire(self, break_lock=False):
    """Takes the lock or raises ValueError naming its holder.

    Args:
      break_lock: take over a lock that looks alive (the user says its run
        is dead).
    """
    self._lock_folder()
    try:
      self._acquire(break_lock)
    except BaseException:
      self._unlock_folder()
      raise

  def _lock_folder(self):
    """Takes the flock of the run directory (local folders), or raises
    ValueError: its holder is certainly alive."""
    folder = paths.parent(self.path)
    if paths.is_url(folder):
      return
    try:
      fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
      return  # writing lock.json will say so
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        return  # a file system without flock (some NFS): lock.json only
      holder = self._read() or {}
      who = (f"pid {str(holder.get('pid'))[:40]} on host "
             f"{str(holder.get('host'))[:80]}" if holder.get("pid") else
             "a live process (its lock.json is gone)")
      raise ValueError(
          f"the run directory {folder} is in use by {who}: it holds the "
          f"folder's OS lock, which ends only with that process; stop it "
          f"first ({self.break_flag} cannot take a live lock). Received: "
          f"lock={self.path!r}") from None
    self._fd = fd
    self._identity = os.fstat(fd)

  def _unlock_folder(self):
    if self._fd is not None:
      os.close(self._fd)  # drops the flock
      self._fd = None

  def _acquire(self, break_lock):
    holder = self._read()
    if holder is not None:
      reason = ("the lock was broken on request" if break_lock else
                self._stale_reason(holder))
      if reason is None:
        raise ValueError(self._refusal(holder))
      print(f"warning: taking over {self.path} held by pid "
            f"{str(holder.get('pid'))[:40]} on "
            f"{str(holder.get('host'))[:80]}: {reason}",
            file=self.out or sys.stderr, flush=True)
    try:
      self._write(overwrite=holder is not None)
    except tf.errors.AlreadyExistsError:
      raise ValueError(self._refusal(self._read() or {})) from None
    # Another run may have renamed its lock in between: the last writer
    # wins, and the loser sees someone else's token.
    current = self._read()
    if not current or current.get("token") != self.info["token"]:
      raise ValueError(self._refusal(current or {}))
    self.held = True

  def _refusal(self, holder):
    if not holder:
      return (f"{self.path} is unreadable; if no run is using this "
              f"model_dir, pass {self.break_flag}=true. Received: "
              f"lock={self.path!r}")
    return (f"the run directory is in use by pid {holder.get('pid')} on "
            f"host {holder.get('host')} since "
            f"{_when(holder.get('started', 0))} (lock {self.path}); "
            f"wait for it, or if that run is dead pass "
            f"{self.break_flag}=true. Received: lock={self.path!r}")

  def verify(self):
    """Raises `LockLost` unless this process still owns the run directory.

    Lost: the folder at the lock's path is not the one locked (moved or
    replaced), or lock.json is gone or carries another run's token (someone
    deleted it, or broke it and started another run).
    """
    if not self.held:
      return
    self.check_folder()
    folder = paths.parent(self.path)
    current = self._read()
    if not current or current.get("token") != self.info["token"]:
      whose = (f"now names pid {str(current.get('pid'))[:40]} on host "
               f"{str(current.get('host'))[:80]}" if current else
               "is gone" if current is None else "is unreadable")
      raise LockLost(
          f"this run lost the lock of {folder}: {self.path} {whose}; "
          f"stopped without writing again, so as not to overwrite another "
          f"run's checkpoints. Received: lock={self.path!r}")

  def check_folder(self):
    """Raises `LockLost` if the locked local folder is no longer at its
    path (moved, or replaced by another); a no-op on gs:// and ram://."""
    if not self.held or self._fd is None:
      return
    folder = paths.parent(self.path)
    try:
      now = os.stat(folder)
    except FileNotFoundError:
      now = None
    if now is None or (now.st_dev, now.st_ino) != (
        self._identity.st_dev, self._identity.st_ino):
      raise LockLost(
          f"the run directory {folder} was moved or replaced during the "
          f"run; stopped without writing to it again: rerun from where the "
          f"folder is now to resume. Received: model_dir={folder!r}")

  def refresh(self):
    """Renews the heartbeat (call every few minutes while training) after
    `verify`: a lock taken by another run is never overwritten."""
    if self.held:
      self.verify()
      self.info["updated"] = time.time()
      self._write(overwrite=True)

  def release(self):
    """Deletes the lock if it is still ours; drops the folder's flock."""
    try:
      if not self.held:
        return
      self.held = False
      current = self._read()
      if current and current.get("token") == self.info["token"]:
        owned_dir.remove(paths.parent(self.path), self.path)
    finally:
      self._unlock_folder()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.release()


@contextlib.contextmanager
def held(folder, name="lock.json", break_lock=False, refused="", out=None):
  """Holds the lock `name` of `folder` for the `with` block; the `RunLock`.

  The folder is made when missing, and removed again on the way out if
  nothing but the lock was ever written to it.

  Args:
    folder: the folder to lock (local path or URL).
    name: the lock file's name in it.
    break_lock: take over a lock that looks alive (`RunLock.acquire`).
    refused: put before the message of a refusal to take the lock.
    out: where take-over warnings go (default: sys.stderr).

  Raises:
    ValueError: another process holds the folder (naming it).
  """
  made = not tf.io.gfile.exists(folder)
  tf.io.gfile.makedirs(folder)
  lock = RunLock(paths.join(folder, name), out=out)
  try:  # a signal during acquire still releases the flock
    try:
      lock.acquire(break_lock)
    except ValueError as e:
      if not refused:
        raise
      raise ValueError(f"{refused}{e}") from None
    yield lock
  finally:
    lock.release()
    if made and tf.io.gfile.isdir(folder) and not tf.io.gfile.listdir(folder):
      owned_dir.remove(paths.parent(folder), folder)  # made for the lock
