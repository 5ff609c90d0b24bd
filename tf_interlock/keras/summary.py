"""`InterlockModel.summary()`: one row per module.

A depthwise split is read module by module (Gomez et al., 2022,
arXiv:2010.04116, Sec. 3): where module k starts and ends in the user's
network, how many weights theta_k its body holds, its aux head A_k (and the
head's weights phi_k), and the device its variables live on. Keras's own
`summary` lists layers of one graph, which an `InterlockModel` (K modules
with cut inputs) does not have.
"""

from tf_interlock.keras import origins as keras_origins

_HEADER = ("Module", "Layers", "Params", "Aux head", "Aux params", "Device")


def _params(layer):
  """Parameter count of a built layer, or None before the build."""
  return layer.count_params() if layer.built else None


def _layers_cell(module):
  names = module.layer_names
  if len(names) == 1:
    return names[0]
  return f"{names[0]} .. {names[-1]} ({len(names)} layers)"


def module_rows(model):
  """The summary's rows: one tuple of cells per module, in depth order.

  Args:
    model: an `InterlockModel`.

  Returns:
    A list of K tuples (module number, layers, body parameters, aux head
    name, aux head parameters, device), each cell a string.
  """
  rows = []
  for k, module in enumerate(model.interlock_modules):
    body = _params(module.body)
    head = module.aux_head
    head_params = None if head is None else _params(head)
    device = ("default" if model.placement is None or
              model.placement.devices is None else model.placement.devices[k])
    rows.append((
        str(k + 1), _layers_cell(module),
        "unbuilt" if body is None else f"{body:,}",
        "-" if head is None else head.name,
        "-" if head is None else (
            "unbuilt" if head_params is None else f"{head_params:,}"),
        str(device)))
  return rows


def summary_lines(model):
  """The table `InterlockModel.summary` prints, as a list of lines."""
  rows = module_rows(model)
  widths = [max(len(r[i]) for r in rows + [_HEADER])
            for i in range(len(_HEADER))]

  def line(cells):
    # Numbers right-aligned, text left-aligned.
    return "  ".join(c.rjust(w) if i in (2, 4) else c.ljust(w)
                     for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

  rule = "-" * len(line(_HEADER))
  lines = [f'Model: "{model.name}" ({model.num_modules} modules, strategy '
           f'{model.interlock_strategy.name})', rule, line(_HEADER), rule]
  lines += [line(r) for r in rows]
  lines.append(rule)
  if model.built:
    body = sum(m.body.count_params() for m in model.interlock_modules)
    heads = sum(m.aux_head.count_params() for m in model.interlock_modules
                if m.has_aux_head)
    lines.append(f"Total params: {body + heads:,} (modules {body:,}, "
                 f"aux heads {heads:,})")
  else:
    lines.append("Total params: unbuilt (build or fit the model first)")
  # Nested models of the model given to from_keras, spread over modules.
  return lines + keras_origins.summary_lines(model.interlock_modules)
