"""Does a checkpoint hold exactly the model about to be restored from it?

`tf.train.Checkpoint.restore` matches objects by their path in the object
graph and fills only what both sides have: a K = 4 checkpoint restored into
a K = 2 model fills modules 1 and 2 and leaves the rest unread, and
`assert_existing_objects_matched` passes (every object of the model found a
value). So before restoring, `difference` compares the variables under the
modules' names on both sides (path within the model and shape) and says in
one line what differs. Both sides are walked breadth first by the names TF's
checkpoints use: the checkpoint's object graph, and the live objects through
`tf.train.TrackableView`.
"""

import keras
import tensorflow as tf

from tf_interlock import tf_private

_VALUE = "VARIABLE_VALUE"


def reader(prefix):
  """A reader of the checkpoint `prefix` (".../ckpt-N"), taken as a prefix
  (tf.train.load_checkpoint would take a ram:// prefix for a folder)."""
  return tf.compat.v1.train.NewCheckpointReader(prefix)


def variable_shapes(reader, prefix="module_"):
  """{path: shape} of the variables under top-level names `prefix`*.

  The path is the breadth-first (shortest) chain of local names from the
  top-level object, so the same model gives the same paths however the
  checkpoint chose to key each value (TF stores a value once, under the
  first path it met, which may run through an optimizer).

  Args:
    reader: a checkpoint reader (`reader(prefix)`).
    prefix: the top-level names to walk.
  """
  graph = tf_private.checkpoint_object_graph(reader)
  shapes = reader.get_variable_to_shape_map()
  found = {}
  for top in graph.nodes[0].children:
    if not top.local_name.startswith(prefix):
      continue
    queue, seen = [(top.node_id, top.local_name)], {top.node_id}
    while queue:
      node_id, path = queue.pop(0)
      for attribute in graph.nodes[node_id].attributes:
        if attribute.name == _VALUE:
          found[path] = tuple(shapes.get(attribute.checkpoint_key, ()))
      for child in graph.nodes[node_id].children:
        if child.node_id not in seen:
          seen.add(child.node_id)
          queue.append((child.node_id, f"{path}/{child.local_name}"))
  return found


def model_shapes(objects):
  """`variable_shapes` of what a checkpoint of `objects` ({name:
  trackable}) would hold, by the same walk over the live objects (nothing
  is written, so remote variables of a cluster stay where they are)."""
  root = tf.train.Checkpoint(**objects)
  view = tf.train.TrackableView(root)
  found = {}
  for name, top in view.children(root).items():
    queue, seen = [(top, name)], {id(top)}
    while queue:
      obj, path = queue.pop(0)
      if isinstance(obj, (tf.Variable, keras.Variable)):
        found[path] = tuple(obj.shape)
      for child_name, child in view.children(obj).items():
        if id(child) not in seen:
          seen.add(id(child))
          queue.append((child, f"{path}/{child_name}"))
  return found


def _modules(shapes):
  return sorted({p.split("/", 1)[0] for p in shapes},
                key=lambda name: int(name.rsplit("_", 1)[1]))


def difference(saved, model):
  """One line saying how two `variable_shapes` differ, or None if equal."""
  if saved == model:
    return None
  saved_modules, model_modules = _modules(saved), _modules(model)
  if saved_modules != model_modules:
    return (f"it holds {len(saved_modules)} modules, the model "
            f"{len(model_modules)}")
  only_saved = sorted(set(saved) - set(model))
  only_model = sorted(set(model) - set(saved))
  if only_saved or only_model:
    parts = [f"{len(saved)} variables against the model's {len(model)}"]
    if only_saved:
      parts.append(f"only in the checkpoint: {only_saved[0]}")
    if only_model:
      parts.append(f"only in the model: {only_model[0]}")
    return "it holds " + "; ".join(parts)
  path = sorted(p for p in saved if saved[p] != model[p])[0]
  return (f"{path} has shape {list(saved[path])} there and "
          f"{list(model[path])} in the model")
