"""The call forms a converted function and a loaded artifact share.

`f(params, ...)` returns `(outputs, new_params)`, every param (tf2jax's form);
`f.with_changed_params(...)` returns `(outputs, changed)`, only the params the call assigned;
`f.outputs_only(...)` returns the outputs alone; `f.returning(form)` picks one by name.
A class provides `_run(form, params, args, kwargs, rng)` for the forms "all", "changed" and
"outputs", and `has_convolutions` (which `jaxport.jit` reads).
"""
from __future__ import annotations

from typing import Callable

from jaxport.errors import UnsupportedValueError


class CallForms:
  """`__call__`, `with_changed_params`, `outputs_only` and `returning` over `self._run`."""

  def _run(self, form: str, params, args, kwargs, rng):
    raise NotImplementedError

  def __call__(self, params, *args, rng=None, **kwargs):
    """`(outputs, new_params)`: every param, the assigned ones updated."""
    return self._run("all", params, args, kwargs, rng)

  def with_changed_params(self, params, *args, rng=None, **kwargs):
    """`(outputs, changed)`: only the params this call assigned, in `param_keys` order, so
    `params = {**params, **changed}` updates them. Inference graphs return `{}`; a loop or conditional
    that assigns a variable carries every param through it, and those all count as changed."""
    return self._run("changed", params, args, kwargs, rng)

  def outputs_only(self, params, *args, rng=None, **kwargs):
    """The outputs alone; variable updates are dropped (use `with_changed_params` to keep them)."""
    return self._run("outputs", params, args, kwargs, rng)

  def returning(self, form: str) -> Callable:
    """The call form named `form`: "all" (`self`), "changed" or "outputs"."""
    forms = {"all": self, "changed": self.with_changed_params, "outputs": self.outputs_only}
    if form not in forms:
      raise UnsupportedValueError(f"call form {form!r} is not one of {sorted(forms)}; pick \"all\" for "
                                  "(outputs, new_params), \"changed\" for (outputs, changed) or \"outputs\".")
    return forms[form]
