"""pytest plugin loaded by run_peer_suite.py (`-p peer_plugin`) into the peer-suite run.

It writes one JSON line per test to $PEER_SUITE_RECORDS as soon as the test ends, so a
run cut short by the overall timeout still leaves every finished result. Each record holds
what the categoriser needs and a junit report would lose:

- the exception type, message, `__notes__` (jaxport notes the TF node / StableHLO op being
  converted) and the op types of an `UnsupportedOperationsError`;
- `raises_mismatch`: an exception of another type escaped an `assertRaises(...)` block;
- `jax2tf`: the test called `jax2tf.convert`, so its graph holds an `XlaCallModule`
  (jax2tf serializes natively);
- `xla_call_module`: a TF graph serialized during the test (`Graph.as_graph_def`, which
  both converters call) holds an `XlaCallModule` node, e.g. a SavedModel made by jax2tf;
- `origin`: the innermost traceback frame in the converter (jaxport or tf2jax);
- `when: "subtest"` records: the `subTest` message of the record just before it (a test
  with a failing subtest fails, as under unittest, though pytest's summary counts it as passed);
- `when: "warning"` records: a jaxport `HostCallbackWarning` (an op ran in TF through the
  host-callback tier) and the op it names.
"""
from __future__ import annotations

import json
import os
import unittest
from typing import Any

import pytest

_state: dict[str, Any] = {"jax2tf": 0, "xla_call_module": False, "raises_mismatch": []}
_records_path = os.environ.get("PEER_SUITE_RECORDS", "peer_suite_records.jsonl")


def _type_names(expected: Any) -> str:
  if isinstance(expected, tuple):
    return "|".join(t.__name__ for t in expected)
  return expected.__name__


def _patch_assert_raises() -> None:
  context = unittest.case._AssertRaisesContext  # pylint: disable=protected-access
  original_exit = context.__exit__

  def __exit__(self, exc_type, exc_value, tb):  # noqa: N807
    if exc_type is not None and not issubclass(exc_type, self.expected):
      _state["raises_mismatch"].append(
          f"expected {_type_names(self.expected)}, got {exc_type.__name__}: "
          f"{str(exc_value).splitlines()[0] if str(exc_value) else ''}"[:300])
    return original_exit(self, exc_type, exc_value, tb)

  context.__exit__ = __exit__


def _patch_jax2tf() -> None:
  try:
    from jax.experimental import jax2tf
  except ImportError:
    return
  original = jax2tf.convert

  def convert(*args, **kwargs):
    _state["jax2tf"] += 1
    return original(*args, **kwargs)

  jax2tf.convert = convert


def _has_xla_call_module(graph_def: Any) -> bool:
  return (any(n.op == "XlaCallModule" for n in graph_def.node) or
          any(n.op == "XlaCallModule" for f in graph_def.library.function for n in f.node_def))


def _patch_as_graph_def() -> None:
  try:
    from tensorflow.python.framework import ops as tf_ops
  except ImportError:
    return
  original = tf_ops.Graph.as_graph_def

  def as_graph_def(self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    if not _state["xla_call_module"]:
      graph_def = result[0] if isinstance(result, tuple) else result
      _state["xla_call_module"] = _has_xla_call_module(graph_def)
    return result

  tf_ops.Graph.as_graph_def = as_graph_def


def pytest_configure(config: pytest.Config) -> None:
  del config
  _patch_assert_raises()
  _patch_jax2tf()
  _patch_as_graph_def()
  # Prove which implementation answers to the name `tf2jax`.
  import tf2jax
  expected = os.environ.get("PEER_SUITE_TARGET")
  served_by_jaxport = getattr(tf2jax, "__served_by__", None) == "jaxport"
  if expected == "jaxport" and not served_by_jaxport:
    raise pytest.UsageError(f"tf2jax resolves to {tf2jax.__file__}, not the jaxport shim")
  if expected == "peer" and served_by_jaxport:
    raise pytest.UsageError("tf2jax resolves to the jaxport shim, not the peer")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
  _state["jax2tf"] = 0
  _state["xla_call_module"] = False
  _state["raises_mismatch"] = []
  yield


def _origin(excinfo: pytest.ExceptionInfo) -> str:
  """The innermost frame inside the converter package, as 'module/file.py:function'."""
  origin = ""
  for entry in excinfo.traceback:
    path = str(entry.path)
    for marker in ("/jaxport/", "/tf2jax/_src/", "/tf2jax/experimental/"):
      if marker in path and not path.endswith("_test.py"):
        origin = f"{path.split(marker)[-1]}:{entry.name}"
  return origin


def _clip(text: str, head: int = 1500, tail: int = 2500) -> str:
  """Long messages keep both ends: a host-callback error puts the real error last."""
  return text if len(text) <= head + tail else f"{text[:head]}\n[…]\n{text[-tail:]}"


def _exception_record(excinfo: pytest.ExceptionInfo) -> dict[str, Any]:
  value = excinfo.value
  chain = []
  cause = value.__cause__ or value.__context__
  while cause is not None and len(chain) < 5:
    chain.append(f"{type(cause).__name__}: {str(cause)[:500]}")
    cause = cause.__cause__ or cause.__context__
  ops = getattr(value, "ops", None)
  return {
      "exc_type": type(value).__name__,
      "exc_mro": [t.__name__ for t in type(value).__mro__],
      "message": _clip(str(value)),
      "notes": [str(n)[:300] for n in getattr(value, "__notes__", [])][:20],
      "unsupported_ops": sorted(ops) if isinstance(ops, dict) else [],
      "chain": chain,
      "origin": _origin(excinfo),
  }


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
  outcome = yield
  report = outcome.get_result()
  if call.when == "call" or (report.failed and call.when in ("setup", "teardown")):
    record: dict[str, Any] = {
        "nodeid": item.nodeid,
        "when": call.when,
        "outcome": report.outcome,
        "duration": round(call.duration, 3),
        "jax2tf": _state["jax2tf"] > 0,
        "xla_call_module": _state["xla_call_module"],
        "raises_mismatch": list(_state["raises_mismatch"]),
    }
    if call.excinfo is not None and report.outcome == "failed":
      record.update(_exception_record(call.excinfo))
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
      record["message"] = str(report.longrepr[2])[:500]
    with open(_records_path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
  """A subtest's report follows the makereport record it wraps: name that record's subtest."""
  context = getattr(report, "context", None)  # pytest's SubtestReport
  if context is None:
    return
  name = context.msg if context.msg is not None else ", ".join(f"{k}={v}" for k, v in context.kwargs.items())
  with open(_records_path, "a", encoding="utf-8") as f:
    f.write(json.dumps({"nodeid": report.nodeid, "when": "subtest", "subtest": str(name)}) + "\n")


def pytest_warning_recorded(warning_message: Any, when: str, nodeid: str, location: Any) -> None:
  del location
  if when == "runtest" and type(warning_message.message).__name__ == "HostCallbackWarning":
    op = str(warning_message.message).split(" ", 1)[0]
    with open(_records_path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"nodeid": nodeid, "when": "warning", "host_callback_op": op}) + "\n")


def pytest_collection_finish(session: pytest.Session) -> None:
  with open(_records_path, "a", encoding="utf-8") as f:
    for item in session.items:
      f.write(json.dumps({"nodeid": item.nodeid, "when": "collected"}) + "\n")


def pytest_collectreport(report: pytest.CollectReport) -> None:
  if report.failed:
    with open(_records_path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"nodeid": report.nodeid, "when": "collect", "outcome": "failed",
                          "exc_type": "CollectionError", "message": str(report.longrepr)[-4000:],
                          "jax2tf": False, "raises_mismatch": []}) + "\n")
