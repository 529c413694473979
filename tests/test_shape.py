"""Rules of hfxla_nb's code, read with `ast` (nothing is imported or run): types for what
crosses modules, no module stored on an instance, no private attribute read across modules.
(How long a module or function is, is left to what its one concept needs.)

Each test prints every violation (file:line, what) and fails with their count.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hfxla_nb"
# Parameters that stand for a run or its context: typed, never `Any`.
TYPED_PARAMETERS = ("run", "ctx")
# Underscored module names that are public inside hfxla_nb (the rule is about underscored
# attributes, not underscored modules): any name that is a module is allowed, these are the ones.
PRIVATE_NAMED_MODULES = ("_xla", "_lazy", "_words", "_version")

Function = ast.FunctionDef | ast.AsyncFunctionDef


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@cache
def tree_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@cache
def nodes_of(path: Path) -> list[ast.AST]:
    """Every node of the file's tree (walked once: the checks below share it)."""
    return list(ast.walk(tree_of(path)))


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def report(violations: list[str], what: str) -> None:
    """Prints every violation (in file and line order), then fails with their count."""
    violations = sorted(violations, key=lambda v: (v.split(":")[0], int(v.split(":")[1])))
    for violation in violations:
        print(violation)
    print(f"{len(violations)} {what}")
    assert not violations, f"{len(violations)} {what}:\n" + "\n".join(violations)


# -- modules: which dotted names are modules -------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def is_module(dotted: str) -> bool:
    """Whether `dotted` names a module or package, read from the files on disk: the top-level
    package's location comes from its spec, which imports nothing."""
    top, *rest = dotted.split(".")
    if top == "hfxla_nb":
        folders = [PACKAGE]
    else:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        if not rest:
            return True
        folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    for folder in folders:
        place = folder.joinpath(*rest) if rest else folder
        if not rest or place.with_suffix(".py").is_file() or (place / "__init__.py").is_file():
            return True
        if place.is_dir() or any(place.parent.glob(place.name + ".*.so")):
            return True
    return False


def imported_from(path: Path, node: ast.ImportFrom) -> str:
    """The absolute name of the module an `from ... import` reads, relative ones resolved."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def module_bindings(path: Path, nodes: list[ast.AST]) -> dict[str, str]:
    """The names an import statement anywhere in the file binds to a module -> that module."""
    bound: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            source = imported_from(path, node)
            for alias in node.names:
                if alias.name != "*" and is_module(f"{source}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
    return bound


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# -- no `run: Any` ------------------------------------------------------------------------


def mentions_any(annotation: ast.AST | None) -> bool:
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if mentions_any(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
    return False


def test_no_run_or_ctx_is_typed_any():
    violations = []
    for path in sources():
        for node in nodes_of(path):
            if isinstance(node, Function):
                arguments = node.args
                for argument in (*arguments.posonlyargs, *arguments.args,
                                 *arguments.kwonlyargs):
                    if argument.arg in TYPED_PARAMETERS and mentions_any(argument.annotation):
                        violations.append(f"{where(path, argument.lineno)}: parameter "
                                          f"`{argument.arg}` of {node.name}() is typed Any")
            elif isinstance(node, ast.AnnAssign):
                target = node.target
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
                if name in TYPED_PARAMETERS and mentions_any(node.annotation):
                    violations.append(f"{where(path, node.lineno)}: `{ast.unparse(target)}` "
                                      f"is typed Any")
    report(violations, "`run` / `ctx` typed Any (give them their type)")


# -- no module stored on an instance ------------------------------------------------------


def assigned_pairs(node: ast.Assign | ast.AnnAssign) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(target, value) pairs of an assignment, tuples unpacked side by side."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
        value = node.value
        if (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                and len(target.elts) == len(value.elts)):
            yield from zip(target.elts, value.elts, strict=True)
        elif value is not None:
            yield target, value


def stored_modules(path: Path, nodes: list[ast.AST]) -> Iterator[str]:
    """`self.<name> = <a module the file imports>`: each such assignment."""
    modules = module_bindings(path, nodes)
    for node in nodes:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        for target, value in assigned_pairs(node):
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self" and isinstance(value, ast.Name)
                    and value.id in modules):
                yield (f"{where(path, node.lineno)}: self.{target.attr} = {value.id} (the "
                       f"module {modules[value.id]}: import it where it is used)")


def test_no_module_is_stored_on_an_instance():
    violations = [found for path in sources() for found in stored_modules(path, nodes_of(path))]
    report(violations, "modules stored on an instance")


# -- no private attribute read across modules ---------------------------------------------


def module_of(node: ast.AST, modules: dict[str, str]) -> str | None:
    """The hfxla_nb module an expression names (`run_mod`, `hfxla_nb.train.finetune`)."""
    if isinstance(node, ast.Name):
        found = modules.get(node.id)
        return found if found and found.split(".")[0] == "hfxla_nb" else None
    if isinstance(node, ast.Attribute):
        outer = module_of(node.value, modules)
        if outer and is_module(f"{outer}.{node.attr}"):
            return f"{outer}.{node.attr}"
    return None


def private_reads(path: Path, nodes: list[ast.AST]) -> Iterator[str]:
    """`<hfxla_nb module>._name` and `from <hfxla_nb module> import _name`: each such read."""
    modules = module_bindings(path, nodes)
    for node in nodes:
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = module_of(node.value, modules)
            if owner and not is_module(f"{owner}.{node.attr}"):
                yield f"{where(path, node.lineno)}: {ast.unparse(node)} ({owner}'s private name)"
        elif isinstance(node, ast.ImportFrom):
            source = imported_from(path, node)
            if source.split(".")[0] != "hfxla_nb":
                continue
            for alias in node.names:
                if is_private(alias.name) and not is_module(f"{source}.{alias.name}"):
                    yield (f"{where(path, node.lineno)}: from {source} import {alias.name} "
                           f"({source}'s private name)")


def test_no_private_attribute_is_read_across_modules():
    violations = [found for path in sources() for found in private_reads(path, nodes_of(path))]
    report(violations, "private names read across modules (make them public, or move the "
                       "code that needs them)")


# -- the checks themselves -------------------------------------------------------------------

EXAMPLE = '''
import torch
import hfxla_nb.train.finetune
from hfxla_nb import _xla, launch
from hfxla_nb.launch import preflight as checks
from ..train import _short, data
from .. import _xla as x, __version__


class Holder:
    def __init__(self, run: Any, ctx: "Any | None", other: Any):
        """Doc.

        More doc.
        """
        # why
        self.torch, self.count = torch, 1
        self.xla: object = _xla
        self.fine = launch

        return None


print(_xla.runtime_is_initialized(), _xla._private, checks._refuse, data._short)
print(hfxla_nb.train.finetune._helper, hfxla_nb._xla, launch.supervision._keeper, x.__name__)
'''


def test_the_checks_find_what_they_look_for():
    assert all(is_module(f"hfxla_nb.{name}") for name in PRIVATE_NAMED_MODULES)
    assert is_module("hfxla_nb.train.worker") and not is_module("hfxla_nb.train.nothing_here")
    assert is_module("json") and not is_module("json.dumps")
    path, tree = PACKAGE / "launch" / "example.py", ast.parse(EXAMPLE)
    nodes = list(ast.walk(tree))
    assert imported_from(path, tree.body[4]) == "hfxla_nb.train"
    assert imported_from(path, tree.body[5]) == "hfxla_nb"
    assert imported_from(PACKAGE / "launch" / "__init__.py", tree.body[4]) == "hfxla_nb.train"
    function = next(node for node in nodes if isinstance(node, Function))
    assert [a.arg for a in function.args.args if mentions_any(a.annotation)] == [
        "run", "ctx", "other"]
    stored = [line.split(": ", 1)[1].split(" (")[0] for line in stored_modules(path, nodes)]
    assert stored == ["self.torch = torch", "self.xla = _xla", "self.fine = launch"]
    read = [line.split(": ", 1)[1].split(" (")[0] for line in private_reads(path, nodes)]
    assert sorted(read) == sorted([
        "from hfxla_nb.train import _short", "_xla._private", "checks._refuse",
        "data._short", "hfxla_nb.train.finetune._helper", "launch.supervision._keeper"])

