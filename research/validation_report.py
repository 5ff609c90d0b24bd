"""report.md of `research.model_validation`, from its two JSON files.

Pure Python: predictions.json (op costs per network and plan, and the step
time the schedule model predicted from them for every cell, written before
any timing) and measured.json (each cell's measured step time) become one
table per network and plan, model / measured per cell, and the list of
cells off by more than `TOLERANCE`. Where both files hold the host's
reference times (`research.host_reference`), each cell also shows the
host's drift between the profile and the cell, and model x drift /
measured: how far off the model is once the host's measured change of
speed is taken out.
"""

TOLERANCE = 0.10
_OPS = ("forward", "input VJP", "weight VJP", "aux", "update", "fused VJP",
        "accumulate")


def rows(predictions, measured):
  """One dict per measured cell (failed cells left out): network, plan,
  strategy, the predicted and measured step seconds with their ranges, and
  model / measured.

  A cell without a prediction is an error in the grid, not a row.

  Raises:
    ValueError: naming the cell that has no prediction.
  """
  out = []
  for cell, row in measured["cells"].items():
    if "error" in row:
      continue
    network, plan, strategy = cell.split("/")
    group = predictions["groups"].get(f"{network}/{plan}", {})
    predicted = group.get("cells", {}).get(strategy)
    if predicted is None:
      raise ValueError(f"measured cell {cell!r} has no prediction in "
                       f"predictions.json. Received: cell={cell!r}")
    ratio = predicted["predicted_step_s"] / row["measured_step_s"]
    host = drift(group.get("host_reference_ms"), row.get("host_reference_ms"))
    out.append(dict(network=network, plan=plan, strategy=strategy,
                    ratio=ratio, drift=host,
                    drift_ratio=None if host is None else ratio * host,
                    **predicted, **row))
  return out


def drift(profile_ms, cell_ms):
  """How much slower the host ran a cell than its profile: the mean of the
  cell's reference times over the mean of the profile's (1.0: the same
  speed; 1.2: 20% slower, which the cell's measured time carries too).

  Args:
    profile_ms: the reference times (ms) taken around the profile.
    cell_ms: those taken around the timed cell.

  Returns:
    The ratio, or None when either is missing or empty (older runs).
  """
  if not profile_ms or not cell_ms:
    return None
  return (sum(cell_ms) / len(cell_ms)) / (sum(profile_ms) / len(profile_ms))


def _ms(seconds):
  return f"{1e3 * seconds:.1f}"


def _cost_lines(group):
  """Per module the median op costs [min-max] over the repetitions (older
  profiles have no fused VJP or accumulation: blank)."""
  lines = ["| module | " + " | ".join(_OPS) + " |",
           "|---" * (len(_OPS) + 1) + "|"]
  for k, (mid, low, high) in enumerate(zip(
      group["module_costs_ms"], group["module_costs_min_ms"],
      group["module_costs_max_ms"]), start=1):
    cells = [f"{m:.2f} [{lo:.2f}-{hi:.2f}]" if m is not None else ""
             for m, lo, hi in zip(mid, low, high)]
    cells += [""] * (len(_OPS) - len(cells))
    lines.append(f"| {k} | " + " | ".join(cells) + " |")
  return lines


def _microbatch_lines(group):
  """Per M, module k's forward / fused VJP / weight VJP at batch / M, as a
  multiple of 1/M of the full batch's (1.00: no per-microbatch overhead)."""
  micro = group.get("microbatch_costs_ms") or {}
  if not micro:
    return []
  full = group["module_costs_ms"]
  lines = ["", "One microbatch's ops against 1/M of the full batch's "
           "(forward, fused VJP, weight VJP; per module):", "",
           "| M | " + " | ".join(f"module {k}" for k in
                                 range(1, len(full) + 1)) + " |",
           "|---" * (len(full) + 1) + "|"]
  for m in sorted(micro, key=int):
    rows = micro[m]["module_costs_ms"]
    cells = []
    for one, whole in zip(rows, full):
      cells.append(" / ".join(
          f"{one[i] * int(m) / whole[i]:.2f}" if whole[i] else "-"
          for i in (0, 5, 2)))
    lines.append(f"| {m} | " + " | ".join(cells) + " |")
  return lines


def _contention_line(group):
  """The contention c the model used, per batch size (v4 on: 1 = none)."""
  by_batch = group["contention"]
  if not isinstance(by_batch, dict):  # The first v4 runs: one factor.
    by_batch = {"whole batch": by_batch}
  text = ", ".join(f"{c:.3f} at batch {b}" for b, c in by_batch.items())
  return (f"Contention c: {text or '1 (none)'} (from "
          f"{group['contention_source']}).")


def render(predictions, measured):
  """The markdown report."""
  table = rows(predictions, measured)
  off = [r for r in table if abs(r["ratio"] - 1.0) > TOLERANCE]
  lines = [
      "# Schedule model, validated out of sample", "",
      f"Command: `{measured['command']}`  ",
      f"Host: {measured['host']} ({measured['machine']}, "
      f"{measured['num_cores']} cores, oneDNN {measured['onednn']}); "
      f"profiled from {predictions['started']}, timed from "
      f"{measured['started']}.", "",
      "Op costs were measured in a separate process per network and plan "
      f"(median of {predictions['repetitions']} repetitions; ranges in "
      "brackets), and every prediction was written to predictions.json "
      "before the first timed run. Each cell was timed in its own process: "
      f"median of {measured['steps']} calls of {measured['steps_per_loop']} "
      "steps after 2 warm-ups. The model's range comes from the cheapest "
      "and the dearest op costs.", ""]
  drifted = [r for r in table if r["drift_ratio"] is not None]
  if table:
    worst = max(table, key=lambda r: abs(r["ratio"] - 1.0))
    lines += [
        f"**{len(table) - len(off)} of {len(table)} cells within "
        f"{TOLERANCE:.0%}.** Worst: {worst['network']} {worst['plan']} "
        f"{worst['strategy']}, model / measured {worst['ratio']:.2f}.", ""]
  if drifted:
    worst = max(drifted, key=lambda r: abs(r["drift_ratio"] - 1.0))
    within = sum(abs(r["drift_ratio"] - 1.0) <= TOLERANCE for r in drifted)
    lines += [
        f"With the host's measured drift since the profile taken out "
        f"(model x drift / measured): **{within} of {len(drifted)} cells "
        f"within {TOLERANCE:.0%}**; worst {worst['network']} {worst['plan']} "
        f"{worst['strategy']}, {worst['drift_ratio']:.2f}. Drift is the "
        "reference workload's time around the cell over its time around the "
        "profile (research.host_reference).", ""]
  for key, group in predictions["groups"].items():
    cells = [r for r in table if f"{r['network']}/{r['plan']}" == key]
    if not cells:
      continue
    with_drift = any(r["drift"] is not None for r in cells)
    extra = " host drift | model x drift / measured |" if with_drift else ""
    lines += [f"## {key} ({group['plan']})", "",
              "| strategy | model ms [range] | measured ms [min-max] | "
              "model / measured |" + extra,
              "|---|---|---|---|" + ("---|---|" if with_drift else "")]
    for r in cells:
      flag = "" if abs(r["ratio"] - 1.0) <= TOLERANCE else " **off**"
      line = (
          f"| {r['strategy']} | {_ms(r['predicted_step_s'])} "
          f"[{_ms(r['predicted_min_s'])}-{_ms(r['predicted_max_s'])}] | "
          f"{_ms(r['measured_step_s'])} [{_ms(r['measured_min_s'])}-"
          f"{_ms(r['measured_max_s'])}] | {r['ratio']:.2f}{flag} |")
      if with_drift:
        line += (" - | - |" if r["drift"] is None else
                 f" {r['drift']:.2f} | {r['drift_ratio']:.2f} |")
      lines.append(line)
    if "contention" in group:
      lines += ["", _contention_line(group)]
    lines += ["", "Op costs, ms per full batch:", ""] + _cost_lines(group)
    lines += _microbatch_lines(group)
    lines.append("")
  failed = {c: r["error"] for c, r in measured["cells"].items()
            if "error" in r}
  if failed:
    lines += ["## Cells that failed", ""] + [
        f"- {cell}: {error}" for cell, error in failed.items()] + [""]
  if off:
    lines += ["## Cells off by more than 10%", ""] + [
        f"- {r['network']} {r['plan']} {r['strategy']}: {r['ratio']:.2f}"
        for r in off] + [""]
  return "\n".join(lines)
