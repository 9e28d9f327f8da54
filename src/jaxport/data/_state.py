"""Loader states: their format, their digest, and the checks a state passes before it is used.

A state is sealed with a SHA-256 digest of its contents, so that a state altered or corrupted
after `Loader.state()` (a flipped byte in a tf.data iterator snapshot can crash or hang TF, or
resume at the wrong place) is rejected before any of it is used. Each check names the field.
"""
import hashlib
import json
import math
from typing import Any

from jaxport.errors import LoaderStateError

STATE_FORMAT = "jaxport.data.Loader/2"
_INT, _OPTIONAL_INT, _STR = "an int", "an int or None", "a string"
_FIELDS = {"format": _STR, "source": _STR, "epoch": _INT, "step": _INT, "batch_size": _OPTIONAL_INT,
           "local_batch_size": _OPTIONAL_INT, "last_batch": _STR, "process_index": _INT,
           "process_count": _INT, "source_state": None, "digest": _STR}
_LOWEST = {"epoch": 0, "step": 0, "process_index": 0, "process_count": 1, "batch_size": 1,
           "local_batch_size": 1}


def digest(state: dict) -> str:
  """The digest of every field of `state` but "digest", as it reads after a JSON round trip."""
  body = {key: value for key, value in state.items() if key != "digest"}
  try:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
  except (TypeError, ValueError) as error:
    raise LoaderStateError("state", f"it is not JSON data ({error}); pass the dict that "
                           "Loader.state() returned, or its JSON round trip.") from None
  return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def seal(state: dict) -> dict:
  state["digest"] = digest(state)
  return state


def is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def check(state: Any, *, steps: float | None) -> None:
  """Raises LoaderStateError unless `state` is a well-formed, intact loader state whose step
  lies within an epoch of `steps` batches (None: unknown)."""
  if not isinstance(state, dict):
    raise LoaderStateError("state", f"expected the dict Loader.state() returned, not a "
                           f"{type(state).__name__}.")
  if state.get("format") != STATE_FORMAT:
    found = state.get("format")
    older = (" It was saved by an older jaxport, whose states carry no digest; save it again "
             "with this version.") if isinstance(found, str) and found.startswith(
                 "jaxport.data.Loader/") else ""
    raise LoaderStateError("format", f"not a loader state (expected format {STATE_FORMAT!r}, "
                           f"found {found!r}).{older}")
  for field, kind in _FIELDS.items():
    if field not in state:
      raise LoaderStateError(field, "missing; pass the whole dict Loader.state() returned.")
    value = state[field]
    fits = (kind is None or (kind == _STR and isinstance(value, str))
            or (kind == _INT and is_int(value))
            or (kind == _OPTIONAL_INT and (value is None or is_int(value))))
    if not fits:
      raise LoaderStateError(field, f"expected {kind}, found {value!r}.")
    if field in _LOWEST and value is not None and value < _LOWEST[field]:
      raise LoaderStateError(field, f"must be >= {_LOWEST[field]}, found {value}.")
  if state["process_index"] >= state["process_count"]:
    raise LoaderStateError("process_index", f"{state['process_index']} is not below the "
                           f"process_count {state['process_count']}.")
  if steps is not None and not math.isinf(steps) and state["step"] > steps:
    raise LoaderStateError("step", f"step {state['step']} is past the end of the epoch, which has "
                           f"{int(steps)} batches here; the state comes from another (longer) "
                           "source or was edited. Restore it into a loader over the same source.")
  if state["digest"] != digest(state):
    raise LoaderStateError("digest", "the state's contents do not match its digest: it was altered "
                           "or corrupted after Loader.state() saved it. Restore an intact copy.")


def past_the_end(start: int, found: int, unit: str) -> LoaderStateError:
  """The error for a replay that ran out of `unit`s (found of them) before the saved step."""
  return LoaderStateError("step", f"the source ended after {found} {unit}, before the saved step "
                          f"{start}: the state comes from another (longer) source. Restore it "
                          "into a loader over the same source.")
