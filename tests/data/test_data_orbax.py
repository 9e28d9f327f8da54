"""jaxport.data.orbax: a loader's position saved with orbax-checkpoint beside the train state."""
import importlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_support import assert_batches_equal, host
import jaxport.data

ocp = pytest.importorskip("orbax.checkpoint")
data_orbax = pytest.importorskip("jaxport.data.orbax")


def examples():
  return [{"x": np.full((3,), i, np.float32), "id": np.int32(i)} for i in range(20)]


def train_step(state, batch):
  return {"w": state["w"] + batch["x"].sum(0), "count": state["count"] + 1}


def test_train_state_and_loader_resume_together(tmp_path):
  make = lambda: jaxport.data.loader(examples(), batch_size=4)
  expected = [host(b) for b in make_epochs(make(), 2)]
  loader, state = make(), {"w": jnp.zeros(3), "count": jnp.array(0)}
  seen = []
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    for batch in loader:  # 5 batches per epoch; save mid-epoch after 3
      seen.append(host(batch))
      state = train_step(state, batch)
      if loader.step == 3:
        manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                data=data_orbax.LoaderSave(loader)))
        break
    manager.wait_until_finished()
  loader.close()
  saved = json.loads((tmp_path / "ckpt" / "3" / "data" / "process_0.json").read_text())
  assert (saved["epoch"], saved["step"]) == (0, 3)

  fresh_loader = make()
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), data=data_orbax.LoaderRestore(fresh_loader)))
  assert restored["data"] is fresh_loader and (fresh_loader.epoch, fresh_loader.step) == (0, 3)
  np.testing.assert_array_equal(restored["state"]["w"], state["w"])
  rest = [host(b) for b in make_epochs(fresh_loader, 2)]
  assert_batches_equal(seen + rest, expected)
  fresh_loader.close()


def make_epochs(loader, epochs):
  return [batch for _ in range(epochs) for batch in loader]


def test_state_dicts_and_errors(tmp_path):
  loader = jaxport.data.loader(examples(), batch_size=4)
  next(loader)
  handler = data_orbax.LoaderCheckpointHandler()
  (tmp_path / "a").mkdir()
  handler.save(tmp_path / "a", args=data_orbax.LoaderSave(loader.state()))
  state = handler.restore(tmp_path / "a", args=data_orbax.LoaderRestore())
  assert state == json.loads(json.dumps(loader.state())) and state["step"] == 1
  with pytest.raises(TypeError, match="LoaderSave takes"):
    data_orbax.LoaderSave([1])
  with pytest.raises(FileNotFoundError, match="no loader state for process 0"):
    handler.restore(tmp_path, args=data_orbax.LoaderRestore(loader))
  (tmp_path / "a" / "process_0.json").write_text("{")
  with pytest.raises(jaxport.errors.LoaderStateError, match="not JSON"):
    handler.restore(tmp_path / "a")
  loader.close()


def test_missing_orbax_is_a_clear_import_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)  # what `import` treats as absent
  monkeypatch.delitem(sys.modules, "jaxport.data.orbax")
  with pytest.raises(ImportError, match=r"pip install 'jaxport\[orbax\]'"):
    importlib.import_module("jaxport.data.orbax")
