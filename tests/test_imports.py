"""The package's import drawing: no circle, and no arrow back up.

Every ``import`` of every module counts, those inside functions too (a
function-level import is still a dependency, only a later one). The
subpackages stand in layers, lowest first; a module imports only from its own
layer or lower ones:

    utils, distribution (helpers on Keras alone) < ops < layers < losses <
    optimizers < models < data < methods < callbacks < the package root
    (``keras_masking/__init__.py``, the library's front door) < clue, demo
    (the applications) < cli

``distribution`` sits with ``utils``: it imports nothing of the package, and
the layers draw their replica-aware random numbers from it.
"""

import ast
import functools
import pathlib

import keras_masking

PACKAGE = pathlib.Path(keras_masking.__file__).parent
LAYERS = [
    ("version", "utils", "distribution"),
    ("ops",),
    ("layers",),
    ("losses",),
    ("optimizers",),
    ("models",),
    ("data",),
    ("methods",),
    ("callbacks",),
    ("",),  # the package root
    ("clue", "demo"),
    ("cli",),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imported(module, node):
    """The package modules one import statement names (a module, not a name in it)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
            package = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        names = [name if name in MODULES else base for name in names]
    found = set()
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module:
            found.add(name)
    return found


@functools.cache
def import_graph():
    """``{module: {modules it imports}}`` over the whole package."""
    graph = {}
    for module, path in MODULES.items():
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module] |= _imported(module, node)
    return graph


def _layer(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_has_a_layer():
    assert not sorted({_layer(module) for module in MODULES} - set(RANK))


def test_no_import_goes_up_a_layer():
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if RANK[_layer(target)] > RANK[_layer(module)]
    )
    assert not upward


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle():
    assert not _cycles(import_graph())


def test_the_checks_see_circles_and_function_level_imports():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    # Imported inside a function, as a module and as a name in a module.
    lookup = graph["keras_masking.methods.token_embedding_lookup"]
    assert "keras_masking.layers.masked_lm_head" in lookup
    assert (
        "keras_masking.models.google_checkpoint_layout"
        in graph["keras_masking.models.tf_checkpoint"]
    )
    assert "keras_masking.utils.arguments" in graph["keras_masking.models.tf_checkpoint"]


def test_importing_the_library_loads_no_application():
    """`import keras_masking` loads the library; CLUE, the demo and the CLI
    load when asked for (``keras_masking.clue`` still works)."""
    import subprocess
    import sys

    code = (
        "import sys, warnings\n"
        "warnings.filterwarnings('error', category=DeprecationWarning, module='keras_masking')\n"
        "import keras_masking\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['keras_masking', 'clue'], ['keras_masking', 'demo'], ['keras_masking', 'cli']))\n"
        "assert not loaded, loaded\n"
        "assert callable(keras_masking.clue.finetune)\n"
        "assert 'keras_masking.clue' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
