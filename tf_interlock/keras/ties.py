"""Tied weights in a functional config: one layer called at several places.

A layer called twice shares its weights between the two calls: keras_hub's
`*CausalLM` task models compute their logits with the token embedding again
(`ReversibleEmbedding(..., reverse=True)`), so the first and the last module
of a depthwise split both read the embedding matrix. A depthwise module
holds its weights on its own device, so `from_keras` gives each module that
calls such a layer its own copy and records the copies as one weight (a
*tie*); the trainer sums the copies' gradients and every copy applies the
same update (`tied_gradients`, docs/method.md "Tied weights").

Here, on configs (as `keras_flatten` and `keras_split` work):

* `untie` turns each later call of a layer into a call of a copy with a
  name of its own, so that every layer of the flat graph has one call and
  the splitter may cut between the calls;
* `merge` folds the copies that land in one module back into one layer
  called several times, as the user's model had it (no copy needed).
"""

_SUFFIX = "_call"


def map_histories(value, fn):
  """A copy of a config with each keras_history h replaced by fn(h)."""
  if isinstance(value, dict):
    if value.get("class_name") == "__keras_tensor__":
      history = fn(list(value["config"]["keras_history"]))
      return dict(value, config=dict(value["config"], keras_history=history))
    return {key: map_histories(v, fn) for key, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [map_histories(v, fn) for v in value]
  return value


def map_refs(refs, fn):
  """A config's input or output layers with each [name, node, tensor]
  mapped (one flat, a list, or a dict of them)."""
  if isinstance(refs, dict):
    return {key: fn(list(r)) for key, r in refs.items()}
  if isinstance(refs[0], str):
    return fn(list(refs))
  return [fn(list(r)) for r in refs]


def unique_name(name, taken):
  """`name`, or `name_2`, `name_3`, ... when it is taken."""
  candidate, i = name, 1
  while candidate in taken:
    i += 1
    candidate = f"{name}_{i}"
  return candidate


def untie(config, keep, taken):
  """`config` with every call of a layer but the first made a copy's call.

  Args:
    config: a functional config (`layers`, `input_layers`,
      `output_layers`).
    keep: names of entries to leave as they are (nested models, which
      `keras_flatten` inlines once or refuses).
    taken: names in use; the copies' names are added. Updated in place.

  Returns:
    (config, copies): the new config, each layer called once, and
    {copy name: the name of the layer it copies}. Call i (0-based) of
    layer `name` becomes the one call of `name_call{i + 1}` (made unique).
  """
  entries, copies, moved = [], {}, {}
  for entry in config["layers"]:
    calls = entry["inbound_nodes"]
    entries.append(entry if len(calls) < 2 or entry["name"] in keep else
                   dict(entry, inbound_nodes=calls[:1]))
    if len(calls) < 2 or entry["name"] in keep:
      continue
    for i, call in enumerate(calls[1:], start=1):
      name = unique_name(f"{entry['name']}{_SUFFIX}{i + 1}", taken)
      taken.add(name)
      copies[name] = entry["name"]
      moved[(entry["name"], i)] = name
      entries.append(dict(entry, name=name, inbound_nodes=[call],
                          config=dict(entry["config"], name=name)))
  if not copies:
    return config, {}

  def history(h):
    name = moved.get((h[0], h[1]))
    return h if name is None else [name, 0] + h[2:]
  config = dict(config, layers=map_histories(entries, history))
  config["output_layers"] = map_refs(config["output_layers"], history)
  return config, copies


def merge(piece, names):
  """A piece's config with the layers `names` (one tie) made one layer.

  The first name keeps its entry, now called once per name in order; the
  others' entries go, and references to their outputs point at the
  matching call of the first.

  Args:
    piece: a functional config whose layers are each called once.
    names: two or more of its layer names, in call order.

  Returns:
    The new config.
  """
  keep, node = names[0], {name: i for i, name in enumerate(names)}
  by_name = {entry["name"]: entry for entry in piece["layers"]}
  calls = [call for name in names for call in by_name[name]["inbound_nodes"]]
  layers = []
  for entry in piece["layers"]:
    if entry["name"] == keep:
      layers.append(dict(entry, inbound_nodes=calls))
    elif entry["name"] not in node:
      layers.append(entry)

  def history(h):
    return [keep, node[h[0]]] + h[2:] if h[0] in node else h
  piece = dict(piece, layers=map_histories(layers, history))
  piece["output_layers"] = map_refs(piece["output_layers"], history)
  return piece


def groups(sources, has_weights):
  """The ties among a flat graph's layers: names that are one layer.

  Args:
    sources: {name in the flat config: the source layer or operation}, in
      config order; a tied layer appears under several names.
    has_weights: `operation -> bool`; a layer without weights (a shared
      activation) is copied freely and ties nothing.

  Returns:
    A list of name lists, each of two or more names in config order.
  """
  by_source = {}
  for name, source in sources.items():
    by_source.setdefault(id(source), (source, []))[1].append(name)
  return [names for source, names in by_source.values()
          if len(names) > 1 and has_weights(source)]


def in_pieces(ties, pieces):
  """Where each tie's names land once the layers are cut into pieces.

  Args:
    ties: `groups`' name lists.
    pieces: each piece's layer names.

  Returns:
    (merges, tied): merges[k] lists the name lists to `merge` in piece k
    (two or more names of one tie in that piece); tied[k] maps the name
    each tie keeps in piece k to the tie's key (its first name) for the
    ties that span two pieces or more.
  """
  merges = [[] for _ in pieces]
  tied = [{} for _ in pieces]
  for names in ties:
    held = [[n for n in names if n in set(piece)] for piece in pieces]
    for k, here in enumerate(held):
      if len(here) > 1:
        merges[k].append(here)
    if sum(1 for here in held if here) > 1:
      for k, here in enumerate(held):
        if here:
          tied[k][here[0]] = names[0]
  return merges, tied
