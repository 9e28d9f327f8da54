"""The `jaxport` command."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
import warnings


def _cmd_demo(args) -> int:
  _quiet_tensorflow()
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


def _cmd_inspect(args) -> int:
  """Prints which tier converts each op of a SavedModel's functions or a Keras file's model.

  Exit status: 0 when everything converts, 1 when some op is unsupported, 2 for bad input.
  """
  try:
    from jaxport.convert.inspect import check_model_path, inspect_path
    check_model_path(args.path)   # answers a wrong path before TensorFlow loads
    if not args.debug:
      _quiet_tensorflow()
    reports = inspect_path(args.path, args.signature)
  except Exception as e:
    return _input_error(e, args)
  converts = all(r.converts for r in reports)
  if args.json:
    print(json.dumps({"path": args.path, "converts": converts, "functions": [r.to_dict() for r in reports]},
                     indent=2))
  else:
    from rich.console import Console
    from rich.markup import escape
    console = Console()
    for report in reports:
      console.print(report)
    bad = [r.name for r in reports if not r.converts]
    if bad:
      console.print(f"[bold red]{len(bad)} of {len(reports)} function(s) use ops no tier converts:[/bold red] "
                    + escape(", ".join(bad)))
    else:
      console.print(f"[green]All {len(reports)} function(s) convert.[/green]")
  return 0 if converts else 1


def _cmd_check(args) -> int:
  print("jaxport check is now jaxport inspect; running: jaxport inspect " + args.path, file=sys.stderr)
  return _cmd_inspect(args)


_VERBS = {"convert": "convert", "bench": "benchmark"}


def _input_error(error: Exception, args, code: int = 2) -> int:
  """One line naming the problem (and the way out) on stderr; the traceback only with --debug."""
  from jaxport.errors import JaxportError
  if args.debug:
    traceback.print_exc()
  if isinstance(error, JaxportError):   # its message names the problem and the way out
    message = str(error) if str(error).startswith(args.path) else f"{args.path}: {error}"
  else:
    first = (str(error).strip().splitlines() or [""])[0][:200]
    message = (f"{args.path}: cannot {_VERBS.get(args.command, 'inspect')} it ({type(error).__name__}: {first})"
               + ("" if args.debug else "; rerun with --debug for the traceback."))
  print(f"jaxport {args.command}: " + " ".join(message.split()), file=sys.stderr)
  return code


# --------------------------------------------------------------------------- convert


_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


class _Stages:
  """A `rich.progress` row per stage (spinner while it runs, full bar when done) on stderr, shown on a
  terminal only, so that piped output and errors stay clean. `seconds` holds each stage's time."""

  def __init__(self, show: bool):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    console = Console(stderr=True)
    self.progress = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"),
                             BarColumn(bar_width=20), TimeElapsedColumn(), console=console,
                             disable=not (show and console.is_terminal))
    self.seconds: dict[str, float] = {}

  def __enter__(self):
    self.progress.start()
    return self

  def __exit__(self, *exc):
    self.progress.stop()

  @contextlib.contextmanager
  def stage(self, name: str, description: str):
    import time
    task = self.progress.add_task(f"{name:<8} {description}", total=1)
    start = time.perf_counter()
    yield
    self.seconds[name] = time.perf_counter() - start
    self.progress.update(task, completed=1)


def _cmd_convert(args) -> int:
  """Converts a model file's function and writes it as a TF-free artifact (jaxport.export).

  Exit status: 0 when written, 1 when the function cannot be converted or exported, 2 for bad input.
  """
  try:
    from jaxport.convert.inspect import check_model_path
    check_model_path(args.path)   # answers a wrong path before TensorFlow loads
    platforms = tuple(p.strip().lower() for p in args.platforms.split(",") if p.strip())
    unknown = [p for p in platforms if p not in _PLATFORMS]
    if unknown or not platforms:
      raise ValueError(f"--platforms {args.platforms!r}: pick from {', '.join(_PLATFORMS)} (comma-separated)")
    _check_out_dir(args.out)
    if args.batch is not None and (args.batch < 1 or args.batch_polymorphic):
      raise ValueError(f"--batch {args.batch}: pass a batch size of 1 or more, and not with --batch-polymorphic")
    max_shard_bytes = None if args.max_shard_bytes is None else _byte_size(args.max_shard_bytes, "--max-shard-bytes")
    if not args.debug:
      _quiet_tensorflow()
  except Exception as e:
    return _input_error(e, args)
  from jaxport import artifact
  from jaxport.convert.model_files import load_model_function
  with _Stages(show=True) as stages:
    try:
      with stages.stage("load", args.path):
        source = load_model_function(args.path, args.signature)
    except Exception as e:
      return _input_error(e, args)
    try:
      with stages.stage("convert", source.name):
        jax_fn, params = source.convert()
      with stages.stage("lower", ", ".join(platforms) + (" (batch-polymorphic)" if args.batch_polymorphic else "")):
        lowered = _lower(artifact, jax_fn, params, platforms, args)
      if lowered.batch_fallback:   # on stderr: the JSON on stdout stays clean
        print(f"jaxport convert: note: {source.name} cannot keep a symbolic batch dim ({lowered.batch_fallback}); "
              f"wrote an artifact for batch {artifact.FALLBACK_BATCH}. Pass --batch N to export another batch "
              "size.", file=sys.stderr)
      with stages.stage("write", args.out):
        manifest = lowered.write(args.out, max_shard_bytes=max_shard_bytes)
    except Exception as e:
      return _input_error(e, args, code=1)
  summary = dict(_convert_summary(args, source.name, manifest, stages.seconds), batch_fallback=lowered.batch_fallback)
  if args.json:
    print(json.dumps(summary, indent=2))
  else:
    _print_convert_summary(summary)
  return 0


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _byte_size(text: str, flag: str) -> int:
  """'4GiB', '500MB', '1048576' as a number of bytes."""
  import re
  match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
  unit = match and match.group(2).lower()
  if not match or unit not in _BYTE_UNITS or float(match.group(1)) * _BYTE_UNITS[unit] < 1:
    raise ValueError(f"{flag} {text!r}: give a size such as 4GiB, 500MB or 1048576 (bytes)")
  return int(float(match.group(1)) * _BYTE_UNITS[unit])


def _lower(artifact, jax_fn, params, platforms, args):
  """The model's function lowered: for --batch N at that batch; with --batch-polymorphic with a symbolic
  batch dim, or failing; by default with a symbolic batch dim where its input specs leave it unknown and
  the model allows it, else at batch 1 (`batch_fallback` says why)."""
  if args.batch is None and not args.batch_polymorphic:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", artifact.BatchFallbackWarning)   # printed as a note instead
      return artifact.lower(jax_fn, params, platforms=platforms)
  example_args, example_kwargs = artifact.example_inputs(jax_fn, args.batch or 1)
  return artifact.lower(jax_fn, params, *example_args, platforms=platforms,
                        batch_polymorphic=args.batch_polymorphic, **example_kwargs)


def _check_out_dir(out: str) -> None:
  from jaxport.artifact import MANIFEST
  from jaxport.errors import ArtifactError
  if os.path.exists(out) and (not os.path.isdir(out) or (os.listdir(out) and not os.path.exists(os.path.join(out, MANIFEST)))):
    raise ArtifactError(f"OUT {out} exists and is not an empty directory or an earlier artifact; pass a new "
                        "directory.")


def _convert_summary(args, function: str, manifest: dict, seconds: dict) -> dict:
  def arrays(entries, key="path"):
    return [{"name": e[key], "shape": e["shape"], "dtype": e["dtype"]} for e in entries]
  params = manifest["params"]
  count = sum(int(_prod(p["shape"])) for p in params)
  conversion = manifest.get("conversion") or {}
  return {"source": args.path, "out": args.out, "function": function, "platforms": manifest["platforms"],
          "batch_polymorphic": manifest["batch_polymorphic"], "inputs": arrays(manifest["inputs"]["leaves"]),
          "outputs": arrays(manifest["outputs"]["leaves"]), "state_outputs": manifest["state_outputs"],
          "requires_rng": manifest["rng"] is not None,
          "params": {"tensors": len(params), "trainable": sum(p["trainable"] for p in params), "values": count},
          "files": {name: entry["bytes"] for name, entry in manifest["files"].items()},
          "tiers": (conversion.get("total") or {}).get("tiers"), "seconds": {k: round(v, 3) for k, v in seconds.items()}}


def _prod(shape) -> int:
  out = 1
  for d in shape:
    out *= d
  return out


def _print_convert_summary(s: dict) -> None:
  from rich.console import Console
  from rich.markup import escape
  from rich.table import Table
  def arrays(entries):
    return "\n".join(escape(f"{e['name']}  {e['dtype']}[{', '.join(map(str, e['shape']))}]") for e in entries) or "-"
  table = Table(title=f"jaxport convert: {escape(s['source'])} → {escape(s['out'])}", title_justify="left",
                show_header=False)
  table.add_column(style="bold")
  table.add_column()
  table.add_row("function", escape(s["function"]))
  table.add_row("inputs", arrays(s["inputs"]))
  table.add_row("outputs", arrays(s["outputs"]))
  p = s["params"]
  table.add_row("params", f"{p['tensors']} tensors ({p['trainable']} trainable), {p['values']:,} values"
                + (f"; updates {len(s['state_outputs'])}" if s["state_outputs"] else ""))
  table.add_row("platforms", ", ".join(s["platforms"]) + ("; batch dim b" if s["batch_polymorphic"] else ""))
  if s["tiers"]:
    table.add_row("ops", ", ".join(f"{t} {c['op_types']} ({c['nodes']} nodes)" for t, c in s["tiers"].items()
                                   if c["op_types"]))
  table.add_row("files", "\n".join(f"{name}  {_size(n)}" for name, n in s["files"].items()))
  table.add_row("time", ", ".join(f"{k} {v:.2f} s" for k, v in s["seconds"].items()))
  Console().print(table)
  print(f"Load it without TensorFlow: fn, params = jaxport.load({s['out']!r})")


def _size(n: int) -> str:
  for unit in ("B", "kB", "MB", "GB"):
    if n < 1000 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1000


# --------------------------------------------------------------------------- bench


def _cmd_bench(args) -> int:
  """Times a model file's function converted (jit) against TF graph and TF XLA.

  Exit status: 0 when timed, 1 when it cannot be converted or run, 2 for bad input.
  """
  try:
    from jaxport.convert.inspect import check_model_path
    check_model_path(args.path)
    if args.plot and not args.plot.endswith(".png"):
      raise ValueError(f"--plot {args.plot}: pass a .png path")
    if not args.debug:
      _quiet_tensorflow()
    from jaxport.convert.model_files import load_model_function
    source = load_model_function(args.path, args.signature)
    inputs = source.example_inputs(args.batch)
  except Exception as e:
    return _input_error(e, args)
  from rich.console import Console
  from jaxport.profiling import profile
  err = Console(stderr=True)
  try:
    with err.status(f"converting, compiling and timing {source.name}...") if err.is_terminal \
        else contextlib.nullcontext():
      result = profile(source.name, source.flat_callable(), tuple(inputs), repeats=args.repeats, tf_xla=True)
  except Exception as e:
    return _input_error(e, args, code=1)
  row = dict(result.as_row(), source=args.path, batch=args.batch, repeats=args.repeats)
  if args.plot:
    try:
      _bench_plot(result, args.plot, args.batch)
    except Exception as e:
      return _input_error(e, args, code=1)
    row["plot"] = args.plot
  if args.json:
    print(json.dumps(row, indent=2))
  else:
    _print_bench(result, args)
  return 0


def _print_bench(r, args) -> None:
  from rich.console import Console
  from rich.markup import escape
  from rich.table import Table
  table = Table(title=f"jaxport bench: {escape(r.name)} (batch {args.batch}, medians of {args.repeats})",
                title_justify="left")
  for col in ("", "conversion s", "compile s", "steady state ms", "vs TF graph"):
    table.add_column(col, justify="left" if not col else "right")
  table.add_row("jaxport (jit)", f"{r.convert_s:.2f}", f"{r.compile_s:.2f}", f"{r.jax_run_s * 1e3:.2f}",
                f"{r.jax_run_s / r.tf_run_s:.2f}x")
  table.add_row("TF graph", "-", "-", f"{r.tf_run_s * 1e3:.2f}", "1.00x")
  table.add_row("TF XLA", "-", f"{r.tf_xla_compile_s:.2f}", f"{r.tf_xla_run_s * 1e3:.2f}",
                f"{r.tf_xla_run_s / r.tf_run_s:.2f}x")
  console = Console()
  console.print(table)
  console.print(f"max abs difference from TF: {r.max_abs_err:.1e}" + (f"; plot written to {escape(args.plot)}"
                                                                        if args.plot else ""))


def _bench_plot(r, path: str, batch: int) -> None:
  try:
    import matplotlib
  except ImportError as e:
    raise ImportError("--plot needs matplotlib: pip install matplotlib") from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = ["jaxport (jit)", "TF graph", "TF XLA"]
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
  ax1.bar(names, [r.jax_run_s * 1e3, r.tf_run_s * 1e3, r.tf_xla_run_s * 1e3], color=["C0", "C1", "C2"])
  ax1.set_ylabel("steady-state run time (ms)")
  ax2.bar(["jaxport\nconvert", "jaxport\ncompile", "TF XLA\ncompile"], [r.convert_s, r.compile_s, r.tf_xla_compile_s],
          color=["C0", "C0", "C2"])
  ax2.set_ylabel("seconds")
  fig.suptitle(f"{r.name}, batch {batch}")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


@contextlib.contextmanager
def _stderr_to_devnull():
  """Sends file descriptor 2 to /dev/null: TF's C++ code writes there before its logging
  is configured, which TF_CPP_MIN_LOG_LEVEL does not reach."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(devnull)
    os.close(saved)


def _quiet_tensorflow() -> None:
  """Imports TensorFlow without its C++ start-up lines and turns its logging down to errors."""
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  try:
    with _stderr_to_devnull():
      import tensorflow as tf
  except ImportError:
    return   # the command itself says what to install
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.ERROR)
  tf.get_logger().setLevel("ERROR")
  for module in ("tensorflow", "keras", "tf_keras", "absl"):
    warnings.filterwarnings("ignore", module=module)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="jaxport", description="Move TensorFlow work into JAX.")
  sub = parser.add_subparsers(dest="command", required=True)
  demo = sub.add_parser("demo", help="convert a built-in Keras model (CNN + LSTM) and compare with TF")
  demo.add_argument("--batch", type=int, default=8)
  demo.add_argument("--repeats", type=int, default=10)
  demo.set_defaults(run=_cmd_demo)
  ops = sub.add_parser("ops", help="list the TF op types with native rules")
  ops.set_defaults(run=_cmd_ops)
  for name, run, what in (("inspect", _cmd_inspect, "show which tier converts each op of a model"),
                          ("check", _cmd_check, "the former name of inspect")):
    cmd = sub.add_parser(name, help=what, description=(
        "Show which tier (native, stablehlo, callback, unsupported) converts each op of a SavedModel "
        "(every signature) or a .keras / .h5 Keras file, before anything runs. Exit status: 0 when "
        "everything converts, 1 when some op is unsupported, 2 for bad input."))
    cmd.add_argument("path", help="a SavedModel directory, a .keras / .h5 file, or (inspect) a .pb / .pbtxt GraphDef")
    cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    cmd.add_argument("--signature", metavar="NAME", help="inspect only this signature (or function)")
    cmd.add_argument("--debug", action="store_true", help="show TF's logs and tracebacks")
    cmd.set_defaults(run=run)
  convert = sub.add_parser("convert", help="convert a model file and write a TF-free artifact", description=(
      "Convert a SavedModel's function or a .keras / .h5 model and write it to OUT as a TF-free artifact "
      "(StableHLO, safetensors params, a JSON manifest) that jaxport.load reads without TensorFlow. Exit status: "
      "0 when written, 1 when it cannot be converted or exported, 2 for bad input."))
  convert.add_argument("path", metavar="SRC", help="a SavedModel directory, a .keras / .h5 file, or (inspect) a .pb / .pbtxt GraphDef")
  convert.add_argument("out", metavar="OUT", help="the artifact directory to write (new, empty, or an earlier artifact)")
  convert.add_argument("--platforms", default="cpu,cuda", help="platforms to lower for, comma-separated "
                       "(cpu, cuda, rocm, tpu; default: cpu,cuda)")
  convert.add_argument("--batch-polymorphic", action="store_true", help="export with a symbolic leading (batch) dim "
                       "on every input, or fail (default: symbolic where the model's batch dim is unknown and it "
                       "can be exported so, else batch 1 with a note)")
  convert.add_argument("--batch", type=int, default=None, help="export for this fixed batch size where the model's "
                       "batch dim is unknown (default: keep it symbolic)")
  convert.add_argument("--signature", metavar="NAME", help="the SavedModel signature or function to convert")
  convert.add_argument("--max-shard-bytes", metavar="SIZE", help="split the params over safetensors files of at most "
                       "this size (e.g. 2GiB) with an index, as on model hubs (default: 4GiB)")
  convert.add_argument("--json", action="store_true", help="print the summary as JSON")
  convert.add_argument("--debug", action="store_true", help="show TF's logs and tracebacks")
  convert.set_defaults(run=_cmd_convert)
  bench = sub.add_parser("bench", help="time a model converted against TF graph and TF XLA", description=(
      "Convert a model file's function, then time conversion, compilation and steady-state runs of the jitted "
      "JAX function against TF graph (tf.function) and TF XLA (jit_compile=True) on random inputs."))
  bench.add_argument("path", metavar="SRC", help="a SavedModel directory, a .keras / .h5 file, or (inspect) a .pb / .pbtxt GraphDef")
  bench.add_argument("--batch", type=int, default=8, help="batch size of the random inputs (default: 8)")
  bench.add_argument("--repeats", type=int, default=10, help="timed runs; medians are shown (default: 10)")
  bench.add_argument("--signature", metavar="NAME", help="the SavedModel signature or function to time")
  bench.add_argument("--json", action="store_true", help="print the timings as JSON")
  bench.add_argument("--plot", metavar="OUT.png", help="write a bar chart of the timings (matplotlib)")
  bench.add_argument("--debug", action="store_true", help="show TF's logs and tracebacks")
  bench.set_defaults(run=_cmd_bench)
  args = parser.parse_args(argv)
  return args.run(args)


if __name__ == "__main__":
  sys.exit(main())
