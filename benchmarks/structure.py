"""Structure counts of the front half (issue 31): ``python benchmarks/structure.py`` prints one Markdown row per
figure with the rule that counts it.  Everything is read from the code (AST, the argparse parser, the service's
pydantic schema, ``ruff``); nothing is run but the parsers.

The layers (``FLOORS``) are the house as it is meant to read, bottom up: a file may import from its own floor or
below; an import of a higher floor "runs back up".  Rooms are the top folders of ``scalemb`` and its top files.
"""
import argparse
import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "scalemb"
sys.path.insert(0, str(ROOT))

FLOORS = {  # room -> floor (1 = ground)
    "_version.py": 1, "errors.py": 1, "geometry": 1, "repulsion": 1, "numba_cache.py": 1, "vecmath.py": 1,
    "lazy.py": 1,
    "models": 2,
    "progress.py": 3,
    "io": 4,  # the input readers, and atomic / object-storage publication that every writer uses
    "affinity": 5, "methods.py": 5,  # the method / metric registry: units above it are named, imported on use
    "engine": 6, "datasets.py": 6,  # executors, with what they build and hold (Evaluation, held rows, factorisations)
    "optim": 7,  # optimisers drive an executor
    "store": 8,  # a run's records: results, checkpoints (the optimiser's state), exports
    "params.py": 9, "init.py": 9,
    "lvq": 10,
    "placement": 11,
    "embedding.py": 12, "run": 12,
    "eigenmaps": 13, "estimator.py": 13, "metrics": 13, "tl.py": 13,
    "plot": 14,
    "report": 15,
    "service": 16,
    "cli": 17, "__main__.py": 18, "__init__.py": 18,
}
METHOD_NAMES = {"eigenmap": "eigenmaps", "kernel-eigenmap": "eigenmaps", "liram": "lvq", "poincare": "affinity"}
PROBE_HOMES = ("affinity/store.py", "affinity/knn.py", "datasets.py", "run/inputs.py")  # probes' homes, resolver
INPUT_KIND_NAMES = {"is_affinity_store", "looks_like_features", "DATASETS", "_is_anndata", "_is_networkx"}


def files():
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def room(path: Path) -> str:
    return path.relative_to(PKG).parts[0]


def module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def absolute(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = parts[:-node.level] if path.name != "__init__.py" else parts[:len(parts) - node.level]
    return ".".join(parts + ([node.module] if node.module else []))


def reexports(init: Path) -> dict:
    """``name -> file`` for the names a package's ``__init__.py`` takes from its modules."""
    names = {}
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = module_file(absolute(init, node))
            for alias in node.names:
                if target is not None:
                    names[alias.asname or alias.name] = target
    return names


def import_edges():
    """``(importer, imported, in_function)`` for every import of a ``scalemb`` file by a ``scalemb`` file; a name
    taken from a package's face is followed to the module that defines it."""
    edges = set()
    for path in files():
        tree = ast.parse(path.read_text())
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if n is not f}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom):
                module = absolute(path, node)
                if not module.startswith("scalemb"):
                    continue
                for alias in node.names:
                    sub = module_file(f"{module}.{alias.name}")
                    target = sub or module_file(module)
                    if target is not None and target.name == "__init__.py" and sub is None:
                        target = reexports(target).get(alias.name, target)
                    targets.append(target)
            elif isinstance(node, ast.Import):
                targets = [module_file(a.name) for a in node.names if a.name.startswith("scalemb")]
            for target in targets:
                if target is not None and target != path:
                    edges.add((path, target, id(node) in inside))
    return edges


def back_up(edges):
    found = [(a, b, f) for a, b, f in edges if FLOORS.get(room(a), 99) < FLOORS.get(room(b), 99)]
    return found


def cycles(edges):
    """Strongly connected sets of more than one file (Tarjan)."""
    graph = defaultdict(set)
    for a, b, _ in edges:
        graph[a].add(b)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(str(g.relative_to(ROOT)) for g in group))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def two_way_pairs(edges):
    """Pairs of rooms (top folders or files of ``scalemb``) each of which has a file importing a file of the
    other: two rooms that lean on each other cannot be read one after the other."""
    pairs = {(room(a), room(b)) for a, b, _ in edges if room(a) != room(b)}
    return sorted(f"{a} <-> {b}" for a, b in pairs if a < b and (b, a) in pairs)


def runner_translations():
    """Calls that build the runner setting by setting: the runner class (``scalemb.embedding.Embedder``, or
    ``scalemb.run``'s runner) called with two keyword arguments or more, or with a ``**`` splat."""
    found = []
    for path in files():
        tree = ast.parse(path.read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and absolute(path, node).endswith(("scalemb.embedding",)):
                names |= {a.asname or a.name for a in node.names if a.name == "Embedder"}
        if path == PKG / "embedding.py":
            names.add("Embedder")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                keywords = [k for k in node.keywords if k.arg is not None]
                if len(keywords) >= 2 or any(k.arg is None for k in node.keywords):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "inspect.signature" and \
                    "embedder" in ast.unparse(node).lower():
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} (inspect)")
    return found


def _embed_parser():
    from scalemb.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["embed"]


def hand_flags():
    """``scalemb embed`` flags of table rows not generated from the row (generated: the help is the row's help
    followed by its default, as ``add_param_arguments`` writes it), and service fields of table rows declared by
    hand on the request's base class."""
    from scalemb.params import PARAMS
    from scalemb.service.requests import JobRequest

    embed = _embed_parser()
    by_flag = {s: a for a in embed._actions for s in a.option_strings}
    hand = []
    for p in PARAMS:
        if p.cli and p.cli in by_flag and by_flag[p.cli].help != f"{p.help} (default {p.outer_default})":
            hand.append(p.cli)
    base = JobRequest.__mro__[1]
    hand += [f"service {n}" for n in getattr(base, "__annotations__", {}) if n in {p.service for p in PARAMS}]
    return hand


def _accepts_cli(embed, flag, value) -> bool:
    action = next(a for a in embed._actions if flag in a.option_strings)
    try:
        parsed = action.type(str(value)) if action.type else str(value)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return action.choices is None or parsed in action.choices


def _accepts_service(field, value) -> bool:
    from typing import Annotated

    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(Annotated[field.annotation, field]).validate_python(value)
        return True
    except ValidationError:
        return False


def differing_bounds():
    """Table rows with both a CLI flag and a service field whose defaults differ or that accept different values
    among the probes (the bounds, one step outside them, each choice and a bogus one)."""
    from scalemb.params import PARAMS
    from scalemb.service.requests import JobRequest

    embed = _embed_parser()
    differ = []
    for p in PARAMS:
        if not (p.cli and p.service) or p.service not in JobRequest.model_fields:
            continue
        action = next((a for a in embed._actions if p.cli in a.option_strings), None)
        if action is None or action.nargs == 0 or action.option_strings[0] == "--model-param":
            continue
        field = JobRequest.model_fields[p.service]
        if isinstance(p.choices, tuple):
            probes = list(p.choices) + ["bogus"]
        else:
            step = 1 if p.type in (int, int | None) else 1e-9
            probes = [p.bounds.get("ge", 0), p.bounds.get("ge", 0) - step, p.bounds.get("le", 10 ** 6),
                      p.bounds.get("le", 10 ** 6) + step, -1, 0, 1, 2 ** 32]
            probes += [p.bounds["lt"] - 1, p.bounds["lt"]] if "lt" in p.bounds else []
            probes = [int(v) if step == 1 else v for v in probes]
        default_differs = action.default != field.default
        if default_differs or any(_accepts_cli(embed, p.cli, v) != _accepts_service(field, v) for v in probes):
            differ.append(p.cli)
    return differ


def perplexity_literals():
    """Lines writing the perplexity default 30: ``perplexity=30`` or a ``30.0`` on a line that names perplexity
    (other 30-second constants, e.g. a lease or a log interval, are not the perplexity default)."""
    out = subprocess.run(["grep", "-rn", "--include=*.py", r"30\.0\|perplexity=30", "scalemb"], cwd=ROOT,
                         capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if "perplexity" in line.lower()]


def neighbour_rules():
    out = subprocess.run(["grep", "-rnE", r"3 \* (self\.)?perplexity", "scalemb", "--include=*.py"], cwd=ROOT,
                         capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if "``" not in line]


def input_kind_functions():
    """Functions that test what an input is: they name ``is_affinity_store``, ``looks_like_features``,
    ``DATASETS`` or the AnnData / networkx probes outside a message (the probes' own modules aside)."""
    found = []
    for path in files():
        tree = ast.parse(path.read_text())
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) or f.name in INPUT_KIND_NAMES or \
                    path.relative_to(PKG).as_posix() in PROBE_HOMES:
                continue
            inner = {id(n) for g in ast.walk(f) if g is not f and isinstance(g, (ast.FunctionDef, ast.Lambda))
                     for n in ast.walk(g)}
            inner |= {id(n) for g in ast.walk(f) if isinstance(g, ast.JoinedStr) or
                      (isinstance(g, ast.Call) and ast.unparse(g.func).endswith(".join")) for n in ast.walk(g)}
            names = {n.id for n in ast.walk(f) if isinstance(n, ast.Name) and id(n) not in inner}
            if names & INPUT_KIND_NAMES:
                found.append(f"{path.relative_to(ROOT)}:{f.name}")
    return found


def name_branches():
    """Files outside a method's or metric's package comparing a value with its name (``==``, ``!=``, ``in``)."""
    found = set()
    for path in files():
        rel = path.relative_to(PKG)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for const in [node.left, *node.comparators]:
                if isinstance(const, ast.Constant) and const.value in METHOD_NAMES and \
                        rel.parts[0] != METHOD_NAMES[const.value]:
                    found.add(str(path.relative_to(ROOT)))
                if isinstance(const, ast.Name) and const.id == "EIGENMAP_MODELS" and rel.parts[0] != "eigenmaps":
                    found.add(str(path.relative_to(ROOT)))
    return sorted(found)


def results_refs():
    out = subprocess.run(["grep", "-rn", "benchmarks/results", "scalemb"], cwd=ROOT, capture_output=True,
                         text=True).stdout.splitlines()
    return out


def complex_functions():
    out = subprocess.run(["ruff", "check", "--select", "C901", "--config", "lint.mccabe.max-complexity=10",
                          "--output-format", "concise", "scalemb"], cwd=ROOT, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "C901" in line]


def long_files():
    return [f"{p.relative_to(ROOT)} {n}" for p in files() if (n := len(p.read_text().splitlines())) > 500]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print what each count found")
    args = parser.parse_args(argv)
    edges = import_edges()
    up = back_up(edges)
    rows = [
        ("hand translations into the runner", runner_translations(),
         "runner class called with >= 2 keywords or **: `python benchmarks/structure.py --list`"),
        ("hand-written flags / fields for table rows", hand_flags(), "`scalemb embed` actions of PARAMS rows whose "
                                                                      "help is not the row's"),
        ("bounds or defaults differing between CLI and service", differing_bounds(),
         "probes each row's bounds, one step out, choices, 'bogus' on argparse and pydantic"),
        ("literal perplexity defaults", perplexity_literals(),
         "`grep -rn --include=*.py \"30\\.0\\\\|perplexity=30\" scalemb \\| grep -i perplexity`"),
        ("neighbour rule min(N-1, 3 perplexity) written", neighbour_rules(),
         "`grep -rnE \"3 \\* (self\\.)?perplexity\" scalemb` (code lines)"),
        ("functions deciding the input kind outside the resolver", input_kind_functions(),
         "functions naming is_affinity_store / looks_like_features / DATASETS / _is_anndata / _is_networkx, "
         "outside scalemb/run/inputs.py and the probes' modules"),
        ("imports running back up", [f"{a.relative_to(ROOT)} -> {b.relative_to(ROOT)}" + (" (in a function)" if f
                                                                                          else "")
                                     for a, b, f in sorted(up)], "file imports to a higher floor of FLOORS"),
        ("  of them inside functions", [f"{a.relative_to(ROOT)} -> {b.relative_to(ROOT)}" for a, b, f in up if f],
         ""),
        ("file cycles", [" -> ".join(c) for c in cycles(edges)], "strongly connected files of the import graph"),
        ("two-way folder pairs", two_way_pairs(edges), "rooms each importing a file of the other"),
        ("files branching on a method / metric name outside its package", name_branches(),
         "comparisons with 'eigenmap', 'kernel-eigenmap', 'liram', 'poincare', EIGENMAP_MODELS"),
        ("references to benchmarks/results in code", results_refs(), "`grep -rn benchmarks/results scalemb`"),
        ("functions over complexity 10", complex_functions(),
         "`ruff check --select C901 --config 'lint.mccabe.max-complexity=10' scalemb`"),
        ("files over 500 lines", long_files(), "`wc -l scalemb/**/*.py`"),
    ]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}\n")
    print("| figure | count | how counted |\n|---|---:|---|")
    for name, found, how in rows:
        print(f"| {name} | {len(found)} | {how} |")
    if args.list:
        for name, found, _ in rows:
            print(f"\n{name}:")
            for item in found:
                print(f"  {item}")


if __name__ == "__main__":
    main()
