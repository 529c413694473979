"""`%load_ext hfxla_nb`: the `%xla_info`, `%xla_doctor`, `%xla_config` and `%%xla_metrics` magics.

The magics only parse arguments and call the API (`hfxla_nb.detect`, `hfxla_nb.configure`,
`hfxla_nb.observe`); panels come from `hfxla_nb.ui`. Bad arguments raise `UsageError`, which
IPython shows as a one-line error; `%xla_info?` shows each magic's help.
"""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

# The file name the `%%xla_metrics` cell's code runs under (its frames name "this cell").
_CELL_FILE = "<xla_metrics cell>"
# Said under the panel of the cell that started the XLA runtime in the kernel.
RUNTIME_STARTED = (
    "This cell started the XLA runtime in this kernel: from now on notebook_launcher refuses "
    "to launch (forked workers would hang) until the kernel restarts (Kernel > Restart "
    "Kernel). Run %%xla_metrics after your launches, or in a notebook of its own."
)


def _parse(magic: Any, line: str):
    """`parse_argstring`, with argparse's exit turned into a `UsageError`."""
    try:
        return parse_argstring(magic, line)
    except SystemExit as error:  # argparse exits on bad input in some IPython versions
        raise UsageError(f"bad arguments: {line!r}") from error


def _display(obj: Any) -> None:
    from IPython.display import display

    display(obj)


@magics_class
class XlaMagics(Magics):
    """The magics of hfxla_nb."""

    @magic_arguments()
    @line_magic
    def xla_info(self, line: str = "") -> None:
        """Show the hardware, runtime, versions and problems found (`hfxla_nb.detect()`).

        Never starts the XLA runtime, so it is safe before `notebook_launcher`.
        """
        _parse(self.xla_info, line)
        from . import runtime
        from .runtime.info import forget
        from .ui.panels import RuntimePanel

        info = runtime.detect()
        _display(RuntimePanel(info))
        forget(info.stopped_launches)  # each is shown once

    @magic_arguments()
    @argument("--steps", default=None,
              help="the steps to run, comma-separated (default: every step of hx.doctor)")
    @argument("--markdown", action="store_true",
              help="print the report as markdown, to paste into an issue")
    @line_magic
    def xla_doctor(self, line: str = "") -> None:
        """Check this host end to end in at most 90 s and show the report (`hfxla_nb.doctor`).

        Every step that runs XLA runs in launched workers: the kernel's runtime stays
        unstarted. `%xla_doctor --markdown` prints a report to paste into an issue.
        """
        args = _parse(self.xla_doctor, line)
        from .diagnosis import doctor

        steps = tuple(s.strip() for s in args.steps.split(",")) if args.steps else None
        try:
            report = doctor(steps=steps)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if args.markdown:
            print(report.to_markdown())
        else:
            _display(report)

    @magic_arguments()
    @argument("--device", choices=("auto", "tpu", "cpu"), default="auto",
              help="auto (the TPU when there is one), tpu or cpu")
    @argument("--cores", type=int, default=None,
              help="on the CPU: number of virtual XLA devices, e.g. 8 to rehearse a TPU host")
    @argument("--debug", action="store_true",
              help="PT_XLA_DEBUG_LEVEL=2: PyTorch/XLA explains every compile and transfer")
    @line_magic
    def xla_config(self, line: str = "") -> dict[str, str] | None:
        """Set up the XLA runtime before first use (`hfxla_nb.configure`), and show what was set.

        Must run before anything touches the XLA device in this kernel.
        """
        args = _parse(self.xla_config, line)
        from . import runtime

        try:
            values = runtime.configure(device=args.device, cores=args.cores, debug=args.debug)
        except (ValueError, RuntimeError) as error:
            raise UsageError(str(error)) from error
        lines = [f"  {name}={value}" for name, value in values.items()] or ["  (nothing)"]
        print("hfxla_nb.configure set:\n" + "\n".join(lines))
        return None

    @magic_arguments()
    @argument("--steps", type=int, default=None,
              help="training steps the cell runs, to give per-step rates (default: the steps "
                   "hfxla_nb.report saw, else the number of torch_xla.sync() calls)")
    @argument("--warmup", type=int, default=None,
              help="steps allowed to compile before compiles per step count (default 10)")
    @cell_magic
    def xla_metrics(self, line: str = "", cell: str = "") -> Any:
        """Run the cell in this kernel and show what XLA compiled, executed, transferred and ran
        on the CPU, with alerts at PyTorch/XLA's thresholds.

        The cell runs in the kernel itself, so XLA work in it starts the XLA runtime here:
        afterwards `notebook_launcher` can no longer fork workers until the kernel restarts.
        `hfxla_nb.report(...)` calls in the cell give the step count and input shapes, which
        name the input behind a recompilation. The metrics are shown even if the cell fails.
        """
        args = _parse(self.xla_metrics, line)
        if args.steps is not None and args.steps < 1:
            raise UsageError("--steps must be a positive integer")
        if args.warmup is not None and args.warmup < 0:
            raise UsageError("--warmup must be zero or more")
        from . import _xla
        from .observe import alerts as analyzer
        from .observe import metrics, reporting, tracing
        from .ui.html import MetricsPanel

        started_before = _xla.runtime_is_initialized()
        numbers = self._cell_numbers()
        trace = tracing.begin_cell(numbers)  # before the cell's first graph
        before = metrics.snapshot()
        with reporting.local_events(lambda event: None):
            try:
                return self._run(cell)
            finally:
                log = trace.end()
                seen = reporting.recorded()
                data = metrics.diff(before, metrics.snapshot())
                data["input_shapes"] = seen["input_shapes"]
                summary = metrics.summarize(
                    data,
                    steps=args.steps or seen["steps"] or None,
                    memory=seen["memory"] or metrics.device_memory(),
                )
                summary.trace = log
                summary.item_lines = [f"cell {numbers[_CELL_FILE]}, line {line}"
                                      for line in _item_lines(self.shell.transform_cell(cell))]
                # A cell that names no loader builds its batches itself: no drop_last advice.
                summary.dataloader = "loader" in cell.lower()
                warmup = metrics.WARMUP_STEPS if args.warmup is None else args.warmup
                alerts = analyzer.analyze(summary, warmup_steps=warmup)
                started = not started_before and _xla.runtime_is_initialized()
                _display(MetricsPanel(summary, alerts, title="XLA metrics for this cell",
                                      note=RUNTIME_STARTED if started else None))

    def _cell_numbers(self) -> dict[str, int]:
        """IPython's cell file names -> execution counts; this cell is `_CELL_FILE`, numbered
        as IPython numbers it (`In [9]`): the entry IPython made for it last, before it ran
        (`execution_count` is already the next one while a cell runs in IPython 9, not in 8)."""
        names = getattr(getattr(self.shell, "compile", None), "_filename_map", None) or {}
        numbers = {str(name): int(count) for name, count in names.items()}
        current = list(numbers.values())[-1] if numbers else None
        if current is None:
            current = int(getattr(self.shell, "execution_count", 0) or 0)
        numbers[_CELL_FILE] = current
        return numbers

    def _run(self, cell: str) -> Any:
        """Run `cell` in the user namespace; the value of a last expression is returned."""
        shell = self.shell
        tree = ast.parse(shell.transform_cell(cell))
        ast.increment_lineno(tree, 1)  # line numbers as the cell shows them (%%xla_metrics: 1)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        namespace = shell.user_ns
        exec(compile(tree, _CELL_FILE, "exec"), namespace)
        if last is not None:
            return eval(compile(last, _CELL_FILE, "eval"), namespace)
        return None


def _item_lines(cell: str) -> list[int]:
    """The lines of the cell (the `%%xla_metrics` line is 1) that call `.item()`."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return []
    return sorted({node.lineno + 1 for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == "item" and not node.args})


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics `%xla_info`, `%xla_doctor`, `%xla_config` and `%%xla_metrics`
    (`%load_ext hfxla_nb`), and the panels of hfxla_nb's results."""
    from .ui import panels

    ipython.register_magics(XlaMagics)
    panels.register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the magics again (`%unload_ext hfxla_nb`)."""
    manager = ipython.magics_manager
    for kind, names in XlaMagics.magics.items():  # what `@magics_class` registered
        for name in names:
            manager.magics[kind].pop(name, None)
    manager.registry.pop("XlaMagics", None)
