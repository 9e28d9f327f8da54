"""A loader's position saved with orbax-checkpoint, beside the model: `pip install 'jaxport[orbax]'`.

    import orbax.checkpoint as ocp
    import jaxport.data.orbax as data_orbax

    manager = ocp.CheckpointManager(directory)
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), data=data_orbax.LoaderSave(loader)))
    ...
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_train_state),
        data=data_orbax.LoaderRestore(loader)))  # restores `loader` in place

The item is the loader's JSON state (`Loader.state()`), one file per process:
`<item directory>/process_<i>.json`. `LoaderSave` takes the state when it is made, that is when
`save()` is called, so an asynchronous save stores the position of the train state it goes with.
"""
import dataclasses
import json
from typing import Any

try:
  import orbax.checkpoint as ocp
  from etils import epath
except ImportError as error:
  raise ImportError("jaxport.data.orbax needs orbax-checkpoint: pip install 'jaxport[orbax]'") \
      from error
import jax

from jaxport.data._loader import Loader
from jaxport.errors import LoaderStateError

__all__ = ["LoaderCheckpointHandler", "LoaderSave", "LoaderRestore"]


def _file(directory: epath.Path) -> epath.Path:
  return epath.Path(directory) / f"process_{jax.process_index()}.json"


class LoaderCheckpointHandler(ocp.CheckpointHandler):
  """Saves and restores a `jaxport.data.Loader`'s state as JSON, one file per process."""

  def save(self, directory: epath.Path, args: "LoaderSave") -> None:
    _file(directory).write_text(json.dumps(args.state))

  def restore(self, directory: epath.Path, args: "LoaderRestore | None" = None) -> Any:
    """The loader of `args`, restored in place; the state dict without one."""
    path = _file(directory)
    if not path.exists():
      saved = sorted(p.name for p in epath.Path(directory).glob("process_*.json"))
      raise FileNotFoundError(
          f"jaxport.data.orbax: no loader state for process {jax.process_index()} in {directory} "
          f"(found {saved or 'none'}): the checkpoint was saved by fewer processes, or holds no "
          "loader item. Restore with as many processes as saved it.")
    try:
      state = json.loads(path.read_text())
    except ValueError as error:
      raise LoaderStateError("state", f"{path} is not JSON ({error}); the checkpoint is "
                             "corrupt.") from None
    if args is None or args.loader is None:
      return state
    args.loader.restore(state)
    return args.loader

  def metadata(self, directory: epath.Path) -> None:
    return None


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)
@dataclasses.dataclass
class LoaderSave(ocp.args.CheckpointArgs):
  """Saves `loader`'s position now (a `Loader`, or a state dict from `Loader.state()`)."""
  loader: Any
  state: dict = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    if isinstance(self.loader, Loader):
      self.state = self.loader.state()
    elif isinstance(self.loader, dict):
      self.state = self.loader
    else:
      raise TypeError(f"jaxport.data.orbax: LoaderSave takes a jaxport.data.Loader or its "
                      f"state() dict, not {type(self.loader).__name__}.")


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class LoaderRestore(ocp.args.CheckpointArgs):
  """Restores `loader` in place (and returns it); with None, returns the saved state dict."""
  loader: Loader | None = None
