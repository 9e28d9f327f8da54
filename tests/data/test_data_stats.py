"""Where a loader's time goes: the source, transform and transfer stages and the consumer's wait,
in Loader.stats() and the progress bar. Magnitudes compared only where they differ by far."""
import io
import re
import time

import numpy as np
from rich.console import Console

import jaxport.data
from jaxport.data._stats import ProgressBar

SLEEP_S = 0.02


class Slow:
  """A re-iterable source of `n` batches (or examples) that sleeps `sleep` per element."""

  def __init__(self, n, sleep, rows=4):
    self.n, self.sleep, self.rows = n, sleep, rows

  def __iter__(self):
    for i in range(self.n):
      time.sleep(self.sleep)
      yield {"x": np.full((self.rows, 3), i, np.float32)}

  def __len__(self):
    return self.n


def test_a_slow_source_dominates():
  # 5x the usual sleep: on a loaded 2-core machine the other stages took ~10% of a 20 ms source.
  loader = jaxport.data.loader(Slow(6, 5 * SLEEP_S), prefetch=0)
  assert len(list(loader)) == 6
  stats = loader.stats()
  assert stats.produced == stats.batches == 6
  ms, fractions = stats.stage_ms, stats.stage_fractions
  assert ms["source"] >= 1e3 * 5 * SLEEP_S * 0.9  # sleep() sleeps at least that long
  assert fractions["source"] > 0.9 and abs(sum(fractions.values()) - 1) < 1e-9
  # Nothing read ahead: the consumer waited through every stage.
  producing = stats.source_seconds + stats.transform_seconds + stats.transfer_seconds
  assert producing <= stats.wait_seconds <= stats.seconds
  text = str(stats)
  assert "per batch: source" in text and "transform" in text and "transfer" in text


def test_a_slow_consumer_does_not_wait():
  loader = jaxport.data.loader(Slow(8, SLEEP_S / 2), prefetch=2)
  for number, _ in enumerate(loader):
    if number == 0:
      first = loader.stats()  # the first batch is always waited for
    # The training step: the prefetch thread reads meanwhile. The step ends once the next batch
    # is made (not after a fixed time), so a loaded machine cannot turn this into a wait.
    time.sleep(5 * SLEEP_S)
    deadline = time.monotonic() + 30
    while loader.stats().produced < min(number + 2, 8) and time.monotonic() < deadline:
      time.sleep(SLEEP_S / 4)
  stats = loader.stats()
  assert stats.batches == 8 and stats.batches <= stats.produced <= stats.batches + 2
  # The source's time hides behind the consumer's.
  waited, read = (stats.wait_seconds - first.wait_seconds,
                  stats.source_seconds - first.source_seconds)
  assert read >= 7 * SLEEP_S / 2 * 0.9 and waited < 0.5 * read
  assert stats.source_seconds + stats.transform_seconds + stats.transfer_seconds <= stats.seconds


def test_examples_are_transformed_on_the_host_and_epochs_add_up():
  loader = jaxport.data.loader(Slow(12, 0, rows=1), batch_size=4, prefetch=1)
  for _ in range(2):
    assert len(list(loader)) == 3
  stats = loader.stats()
  assert stats.batches == stats.produced == 6
  assert stats.transform_seconds > 0 and stats.transfer_seconds > 0 and stats.source_seconds > 0
  assert stats.source_seconds + stats.transform_seconds + stats.transfer_seconds <= stats.seconds
  fresh = jaxport.data.loader(Slow(12, 0, rows=1), batch_size=4).stats()
  assert fresh.produced == 0 and fresh.stage_ms == dict.fromkeys(
      ("source", "transform", "transfer", "wait"), 0.0) and "source 0.00 ms (0%)" in str(fresh)


def test_progress_bar_shows_the_stages():
  out = io.StringIO()
  loader = jaxport.data.loader(Slow(3, SLEEP_S), progress=True, prefetch=0)
  loader._bar = ProgressBar(console=Console(file=out, force_terminal=True, width=300))
  assert len(list(loader)) == 3
  loader.close()
  text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # colours, cursor
  assert "epoch 0" in text and "ms/batch: source" in text and "transfer" in text and "wait" in text
