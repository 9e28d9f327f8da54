"""benchmarks/convert_bench.py's compile section (`_compile_time.py`) on a small model: each side runs cold
in its own process and reports every part it times."""
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).parents[1] / "benchmarks"


@pytest.mark.slow
def test_compile_section_times_each_side_in_its_own_process(monkeypatch):
  monkeypatch.syspath_prepend(str(BENCHMARKS))
  from rich.console import Console

  import _compile_time
  console = Console(record=True, width=250)
  (row,) = _compile_time.compile_rows(console, ["LSTM"], batch=2, repeats=1)
  assert set(row.jaxport) == set(_compile_time._JAXPORT_PARTS) and set(row.tf) == set(_compile_time._TF_PARTS)
  assert all(v > 0 for v in [*row.jaxport.values(), *row.tf.values()])
  assert row.jaxport_total == pytest.approx(sum(row.jaxport.values()))
  printed = console.export_text()
  assert "LSTM" in printed and "TF XLA total" in printed


def test_a_failing_side_reports_its_error(monkeypatch):
  monkeypatch.syspath_prepend(str(BENCHMARKS))
  import _compile_time
  with pytest.raises(RuntimeError, match="NoSuchModel"):
    _compile_time._run_side("jaxport", "NoSuchModel", 2)
