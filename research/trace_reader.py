"""Reads a TensorBoard profiler trace into each device's ops over time.

TF 2.21 writes one `<host>.xplane.pb` per trace (an `XSpace` proto) under
`<log dir>/plugins/profile/<time>/`, and no trace-viewer JSON: that is made
by the profile plugin, which is not installed here. The XSpace's
"/host:CPU" plane has one line per thread. An op is an event named
"op_name:OpType" nested in an "ExecutorState::Process" event, whose `_c`
stat names the executor running it: one executor per device of each
function's partitioned graph. The device is not among an op's stats, but
every partition sends tensors to the others: a `_Send` op's `key` stat
starts with its own (sending) device, which names its executor's device.
An executor that sent nothing in the trace is left out (`Trace.unplaced`
counts its ops).
"""

import collections
import dataclasses
import re
from typing import Dict, List, Tuple

from google.protobuf import message
import tensorflow as tf

from tf_interlock import tf_private
from train import user_files

_HOST_PLANE = "/host:CPU"
_PROCESS = "ExecutorState::Process"
_TRANSFERS = ("_Send", "_Recv", "_HostSend", "_HostRecv")
_DEVICE = re.compile(r"(/device:[A-Z_]+:\d+)$")


@dataclasses.dataclass(frozen=True)
class Op:
  """One op run: its device, name, type and start/end in seconds."""
  device: str  # e.g. "/device:CPU:1"
  name: str
  type: str
  start_s: float
  end_s: float

  @property
  def kind(self):
    """forward, backward, update or transfer, from the op's name."""
    if self.type in _TRANSFERS:
      return "transfer"
    if "gradient" in self.name:
      return "backward"
    if re.search(r"(^|/)(sgd|adam|adamw)(_\d+)?/|Assign", self.name):
      return "update"
    return "forward"


@dataclasses.dataclass
class Trace:
  """The ops of one trace, the first one's start at 0."""
  ops: List[Op]
  unplaced: int  # ops of executors whose device the trace does not name

  @property
  def devices(self):
    return sorted({op.device for op in self.ops},
                  key=lambda d: (d.rsplit(":", 2)[-2], int(d.rsplit(":")[-1])))

  @property
  def span_s(self):
    return (max(op.end_s for op in self.ops) -
            min(op.start_s for op in self.ops)) if self.ops else 0.0


def find_traces(log_dir):
  """The .xplane.pb files under `log_dir`/plugins/profile, oldest first."""
  pattern = f"{log_dir}/plugins/profile/*/*.xplane.pb"
  return sorted(tf.io.gfile.glob(pattern))


def _stats(plane, stats):
  names = plane.stat_metadata
  out = {}
  for stat in stats:
    kind = stat.WhichOneof("value")
    value = getattr(stat, kind) if kind else None
    out[names[stat.metadata_id].name] = (
        names[value].name if kind == "ref_value" else value)
  return out


def read(path):
  """The `Trace` of the .xplane.pb file `path`.

  Raises:
    ValueError: one line if `path` is no regular file (a FIFO), is larger
      than `user_files.MAX_TRACE_BYTES`, is no XSpace proto (truncated or
      another file), or holds no host plane or no placed op.
  """
  data = user_files.read_input(path, "trace", user_files.MAX_TRACE_BYTES)
  try:
    space = tf_private.profiler_xspace(data)
  except message.DecodeError as e:
    raise ValueError(f"{path} is not a readable profiler trace (an XSpace "
                     f"proto; truncated or another file: {e}). Received: "
                     f"trace={path!r}") from None
  planes = [p for p in space.planes if p.name == _HOST_PLANE]
  if not planes:
    raise ValueError(f"{path} holds no {_HOST_PLANE} plane: not a TF CPU "
                     f"profile. Received: path={path!r}")
  plane = planes[0]
  runs, device_of = [], {}  # runs: (context, Op fields)
  for line in plane.lines:
    context, end = None, 0
    for event in line.events:
      meta = plane.event_metadata[event.metadata_id]
      start_ns = line.timestamp_ns + event.offset_ps / 1e3
      if meta.name == _PROCESS:
        context = _stats(plane, event.stats).get("_c")
        end = event.offset_ps + event.duration_ps
        continue
      if context is None or event.offset_ps >= end or ":" not in meta.name \
          or "::" in meta.name:
        continue
      name, op_type = meta.name.rsplit(":", 1)
      if op_type == "_Send":
        found = _DEVICE.search(str(_stats(plane, event.stats).get(
            "key", "")).split(";")[0])
        if found:
          device_of[context] = found.group(1)
      runs.append((context, name, op_type, start_ns,
                   start_ns + event.duration_ps / 1e3))
  placed = [run for run in runs if run[0] in device_of]
  if not placed:
    raise ValueError(f"{path} holds no op placed on a device (a trace of "
                     f"training steps on several devices was expected). "
                     f"Received: path={path!r}")
  origin = min(run[3] for run in placed)
  ops = [Op(device_of[c], name, op_type, (start - origin) / 1e9,
            (end - origin) / 1e9) for c, name, op_type, start, end in placed]
  return Trace(sorted(ops, key=lambda op: op.start_s),
               len(runs) - len(placed))


def busy_intervals(ops):
  """The union of `ops`' [start, end] as sorted disjoint intervals."""
  merged = []
  for op in sorted(ops, key=lambda op: op.start_s):
    if merged and op.start_s <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], op.end_s)
    else:
      merged.append([op.start_s, op.end_s])
  return [tuple(m) for m in merged]


def summary(trace) -> Dict[str, object]:
  """Per device: ops and busy fraction of the trace's span; overall: the
  fractions of the span with at least 2 devices busy and with all busy."""
  span = max(trace.span_s, 1e-12)
  per_device: Dict[str, List[Tuple[float, float]]] = {
      device: busy_intervals([op for op in trace.ops if op.device == device])
      for device in trace.devices}
  edges = collections.Counter()
  for intervals in per_device.values():
    for start, end in intervals:
      edges[start] += 1
      edges[end] -= 1
  at_least_two = all_busy = 0.0
  busy, last = 0, 0.0
  for time in sorted(edges):
    if busy >= 2:
      at_least_two += time - last
    if busy == len(per_device):
      all_busy += time - last
    busy, last = busy + edges[time], time
  counts = collections.Counter(op.device for op in trace.ops)
  return {
      "span_s": trace.span_s,
      "devices": {device: {
          "ops": counts[device],
          "busy_fraction": sum(e - s for s, e in intervals) / span}
                  for device, intervals in per_device.items()},
      "two_or_more_busy_fraction": at_least_two / span,
      "all_busy_fraction": all_busy / span, "unplaced_ops": trace.unplaced}
