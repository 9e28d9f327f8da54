"""The `jaxport` command."""
from __future__ import annotations

import argparse
import sys


def _cmd_demo(args) -> int:
  from jaxport.demo import run_demo
  return run_demo(batch=args.batch, repeats=args.repeats)


def _cmd_ops(args) -> int:
  from rich.columns import Columns
  from rich.console import Console

  from jaxport.convert.registry import supported_ops
  ops = sorted(supported_ops())
  console = Console()
  console.print(f"{len(ops)} TensorFlow op types have native rules:")
  console.print(Columns(ops, equal=True))
  return 0


def _cmd_check(args) -> int:
  """Lists the ops of a SavedModel's signatures that jaxport cannot convert."""
  import os
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow as tf
  from rich.console import Console
  from rich.table import Table

  from jaxport.convert.api import unsupported_in_concrete
  console = Console()
  restored = tf.saved_model.load(args.path)
  table = Table(title=f"jaxport check: {args.path}")
  table.add_column("signature")
  table.add_column("unsupported ops (nodes)")
  bad = 0
  for name, fn in restored.signatures.items():
    missing = unsupported_in_concrete(fn)
    bad += bool(missing)
    table.add_row(name, "\n".join(f"{op} ({len(nodes)})" for op, nodes in missing.items()) or "[green]none[/green]")
  console.print(table)
  return 1 if bad else 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="jaxport", description="Move TensorFlow work into JAX.")
  sub = parser.add_subparsers(dest="command", required=True)
  demo = sub.add_parser("demo", help="convert a built-in Keras model (CNN + LSTM) and compare with TF")
  demo.add_argument("--batch", type=int, default=8)
  demo.add_argument("--repeats", type=int, default=10)
  demo.set_defaults(run=_cmd_demo)
  ops = sub.add_parser("ops", help="list the TF op types with native rules")
  ops.set_defaults(run=_cmd_ops)
  check = sub.add_parser("check", help="list a SavedModel's unsupported ops")
  check.add_argument("path")
  check.set_defaults(run=_cmd_check)
  args = parser.parse_args(argv)
  return args.run(args)


if __name__ == "__main__":
  sys.exit(main())
