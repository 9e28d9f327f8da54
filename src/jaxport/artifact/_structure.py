"""The nesting of an artifact's inputs and outputs, written as plain JSON (no pickle).

A structure is a tree of JSON objects, one per node:

  {"kind": "leaf", "index": i}                     the i-th array of the flat list
  {"kind": "static", "value": v}                   a Python value fixed at export (None, bool, int, float, str)
  {"kind": "tuple" | "list", "items": [...]}
  {"kind": "dict", "keys": [...], "items": [...]}  keys are str or int, in flattening order (sorted)
  {"kind": "namedtuple", "name": N, "fields": [...], "items": [...]}

`encode` writes one from a Python value; `Structure.read` checks one read back from a
file (every field, the depth, leaf indices 0..n-1 used once) before anything uses it.
"""
from __future__ import annotations

import collections
import keyword
from collections.abc import Mapping
from typing import Any, Callable

from jaxport.errors import MissingInputError

MAX_DEPTH = 64
_STATIC = (type(None), bool, int, float, str)


def _sorted_keys(mapping: Mapping) -> list:
  keys = list(mapping)
  try:
    return sorted(keys)
  except TypeError:   # mixed key types
    return sorted(keys, key=lambda k: (type(k).__name__, str(k)))


def child_path(path: str, key) -> str:
  """`args` + 0 → `args[0]`; the kwargs dict names its entries by key alone (`scale`).

  The inputs' root (path "") is the pair `(args, kwargs)`."""
  if path == "":
    return ("args", "kwargs")[key]
  if path == "kwargs":
    return str(key)
  return f"{path}[{key!r}]" if isinstance(key, str) else f"{path}[{key}]"


def encode(value, is_array: Callable[[Any], bool], path: str) -> tuple[dict, list, list[str]]:
  """(JSON node, the array leaves in flattening order, their paths)."""
  leaves: list = []
  paths: list[str] = []

  def walk(x, where: str, depth: int) -> dict:
    if depth > MAX_DEPTH:
      raise TypeError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(x, Mapping):
      keys = _sorted_keys(x)
      for k in keys:
        if isinstance(k, bool) or not isinstance(k, (str, int)):
          raise TypeError(f"{where}: dict key {k!r} is neither a str nor an int; an artifact stores str and "
                          "int keys only")
      return {"kind": "dict", "keys": keys, "items": [walk(x[k], child_path(where, k), depth + 1) for k in keys]}
    if isinstance(x, tuple) and hasattr(type(x), "_fields"):
      return {"kind": "namedtuple", "name": type(x).__name__, "fields": list(type(x)._fields),
              "items": [walk(v, f"{where}.{f}", depth + 1) for f, v in zip(type(x)._fields, x)]}
    if isinstance(x, (tuple, list)):
      return {"kind": type(x).__name__ if type(x) in (tuple, list) else ("list" if isinstance(x, list) else "tuple"),
              "items": [walk(v, child_path(where, i), depth + 1) for i, v in enumerate(x)]}
    if is_array(x):
      leaves.append(x)
      paths.append(where)
      return {"kind": "leaf", "index": len(leaves) - 1}
    if isinstance(x, _STATIC):
      return {"kind": "static", "value": x}
    raise TypeError(f"{where}: a {type(x).__name__} can be neither an array nor a fixed value (None, bool, int, "
                    "float, str) of an artifact")

  node = walk(value, path, 0)
  return node, leaves, paths


class Structure:
  """A checked structure: guided flattening of call arguments, unflattening of results."""

  def __init__(self, node: dict, n_leaves: int, namedtuples: dict):
    self.node, self.n_leaves, self._namedtuples = node, n_leaves, namedtuples

  @classmethod
  def read(cls, node, n_leaves: int, fail: Callable[[str], Exception], where: str) -> "Structure":
    """Checks a JSON node read from a manifest; `fail(message)` makes the error to raise."""
    seen: list[int] = []
    namedtuples: dict = {}

    def check(x, at: str, depth: int) -> None:
      if depth > MAX_DEPTH:
        raise fail(f"{at} is nested more than {MAX_DEPTH} levels deep")
      if not isinstance(x, dict) or not isinstance(x.get("kind"), str):
        raise fail(f"{at} is not a structure node (a JSON object with a 'kind')")
      kind = x["kind"]
      allowed = {"leaf": {"kind", "index"}, "static": {"kind", "value"}, "tuple": {"kind", "items"},
                 "list": {"kind", "items"}, "dict": {"kind", "keys", "items"},
                 "namedtuple": {"kind", "name", "fields", "items"}}.get(kind)
      if allowed is None:
        raise fail(f"{at} has the unknown kind {kind!r}")
      if set(x) != allowed:
        raise fail(f"{at} ({kind}) has the fields {sorted(x)}, expected {sorted(allowed)}")
      if kind == "leaf":
        index = x["index"]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_leaves:
          raise fail(f"{at} names array {index!r}, but there are {n_leaves}")
        seen.append(index)
        return
      if kind == "static":
        if not isinstance(x["value"], _STATIC):
          raise fail(f"{at} holds a fixed value of type {type(x['value']).__name__}")
        return
      items = x["items"]
      if not isinstance(items, list):
        raise fail(f"{at}.items is not a list")
      if kind == "dict":
        keys = x["keys"]
        if (not isinstance(keys, list) or len(keys) != len(items) or len(set(map(repr, keys))) != len(keys)
            or any(isinstance(k, bool) or not isinstance(k, (str, int)) for k in keys)):
          raise fail(f"{at}.keys must be {len(items)} distinct str or int keys")
      if kind == "namedtuple":
        name, fields = x["name"], x["fields"]
        if not _identifier(name) or not isinstance(fields, list) or len(fields) != len(items) \
            or not all(_identifier(f) for f in fields) or len(set(fields)) != len(fields):
          raise fail(f"{at} is a namedtuple whose name or fields are not plain identifiers")
        key = (name, tuple(fields))
        if key not in namedtuples:
          namedtuples[key] = collections.namedtuple(name, fields)   # validated identifiers only
      for i, item in enumerate(items):
        check(item, f"{at}.items[{i}]", depth + 1)

    check(node, where, 0)
    if sorted(seen) != list(range(n_leaves)):
      raise fail(f"{where} does not use each of its {n_leaves} arrays exactly once")
    return cls(node, n_leaves, namedtuples)

  def flatten(self, value, path: str) -> list:
    """The array leaves of `value`, which must have this structure; fixed values must match."""
    leaves: list = [None] * self.n_leaves

    def walk(node: dict, x, where: str) -> None:
      kind = node["kind"]
      if kind == "leaf":
        leaves[node["index"]] = x
      elif kind == "static":
        if not (x is node["value"] or (type(x) is type(node["value"]) and x == node["value"])):
          raise MissingInputError(f"{where}: the artifact was exported with {node['value']!r} here, got {x!r}; "
                                  "a fixed (non-array) input cannot change after export: export again with the "
                                  "value you need.")
      elif kind == "dict":
        if not isinstance(x, Mapping) or set(map(repr, x)) != set(map(repr, node["keys"])):
          got = sorted(map(repr, x)) if isinstance(x, Mapping) else type(x).__name__
          raise MissingInputError(f"{where}: expected a dict with keys {sorted(map(repr, node['keys']))}, got "
                                  f"{got}; call with the structure of arguments used at export.")
        for k, item in zip(node["keys"], node["items"]):
          walk(item, x[k], child_path(where, k))
      else:
        if not isinstance(x, (tuple, list)) or len(x) != len(node["items"]):
          got = f"{len(x)} items" if isinstance(x, (tuple, list)) else f"a {type(x).__name__}"
          raise MissingInputError(f"{where}: expected a {kind} of {len(node['items'])} items, got {got}; call "
                                  "with the structure of arguments used at export.")
        for i, (item, v) in enumerate(zip(node["items"], x)):
          walk(item, v, child_path(where, i))

    walk(self.node, value, path)
    return leaves

  def unflatten(self, leaves) -> Any:
    def build(node: dict):
      kind = node["kind"]
      if kind == "leaf":
        return leaves[node["index"]]
      if kind == "static":
        return node["value"]
      items = [build(item) for item in node["items"]]
      if kind == "dict":
        return dict(zip(node["keys"], items))
      if kind == "namedtuple":
        return self._namedtuples[(node["name"], tuple(node["fields"]))](*items)
      return tuple(items) if kind == "tuple" else items
    return build(self.node)


def _identifier(name) -> bool:
  return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")
