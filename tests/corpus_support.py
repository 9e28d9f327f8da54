"""Corpora of real programs: CI runs a sample of each, `make test-full` runs them all."""
from typing import Iterable

import pytest


def sampled(cases: Iterable, in_ci: Iterable[str]) -> list:
  """`cases` as pytest params (each a `pytest.param` with an id, or a (id, value) pair); those whose
  id is not in `in_ci` carry the `full_corpus` mark, which `make test` (CI) deselects."""
  in_ci = set(in_ci)
  params, ids = [], set()
  for case in cases:
    if not hasattr(case, "id"):
      case_id, value = case
      case = pytest.param(value, id=case_id)
    ids.add(case.id)
    if case.id not in in_ci:
      case = pytest.param(*case.values, id=case.id, marks=[*case.marks, pytest.mark.full_corpus])
    params.append(case)
  unknown = in_ci - ids
  assert not unknown, f"the CI sample names cases the corpus lacks: {sorted(unknown)}"
  return params
