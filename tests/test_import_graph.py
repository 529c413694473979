"""No import cycle inside hfxla_nb: import-linter's layers order the packages, this orders the
modules within them too (import-linter has no cycle contract). The graph is grimp's, the one
import-linter reads: every import, also those inside functions."""

from __future__ import annotations

import graphlib

import grimp


def import_cycle(graph: grimp.ImportGraph, package: str) -> list[str] | None:
    """One cycle of imports among `package`'s modules (`[a, b, a]`: a imports b imports a),
    or None when their imports form no cycle."""
    inside = {module for module in graph.modules if module.split(".")[0] == package}
    imports = {module: {imported for imported in graph.find_modules_directly_imported_by(module)
                        if imported in inside}
               for module in inside}
    try:
        graphlib.TopologicalSorter(imports).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for importer, imported in (("pkg.text", "pkg.compilations"), ("pkg.compilations", "pkg.text"),
                               ("pkg.html", "pkg.text"), ("pkg.text", "other.module")):
        graph.add_import(importer=importer, imported=imported)
    cycle = import_cycle(graph, "pkg")
    assert cycle is not None and set(cycle) == {"pkg.text", "pkg.compilations"}
    graph.remove_import(importer="pkg.compilations", imported="pkg.text")
    assert import_cycle(graph, "pkg") is None


def test_no_module_of_hfxla_nb_imports_itself_through_others():
    cycle = import_cycle(grimp.build_graph("hfxla_nb"), "hfxla_nb")
    assert cycle is None, (
        "import cycle: " + " -> ".join(cycle or [])
        + ". Move what both modules need into a module below them (as ui/units.py is for "
          "ui/text.py and ui/compilations.py).")
