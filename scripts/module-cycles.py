#!/usr/bin/env python3
"""Module cycles in the workspace's crates: module A names module B (`crate::b`, `super::b`,
or, in a parent module, a child `b::`) and B names A, directly or around a longer loop.

Each module is a file (`lib.rs` is the crate root, `x/mod.rs` is `x`); a file's own
`#[cfg(test)] mod tests` is read with it. A parent naming its own children does not count
(the crate root declares and re-exports every module). Prints each strongly connected component of more
than one module, per crate; exits 1 if any, so CI may run it.

    python3 scripts/module-cycles.py                 # every crate under crates/
    python3 scripts/module-cycles.py crates/preload  # one crate

For the whole workspace it printed four on wave/glue (`launch: leftovers slurm`, `rpc: sim
transport`, `server: gate name_locks`, `ucx: endpoint memory operation worker`; preload's
eight-module cycle and python's `client`/`file` were closed there); main closed the first
three, and `ucx` is the one left.
"""
import re
import sys
from pathlib import Path


def module_of(source: Path, src: Path) -> str:
    parts = list(source.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts.pop()
    return "::".join(parts) or "crate"


def named_modules(text: str, module: str, modules: set[str]) -> set[str]:
    """The crate's modules that `text` (the file of `module`) names."""
    prefix = [] if module == "crate" else module.split("::")
    names = set()
    for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
        names.update(item.strip().split("::")[0].split(" ")[0] for item in group.split(","))
    names.update(re.findall(r"\bcrate::(\w+)", text))
    for path in re.findall(r"\bsuper::(\w+)", text):
        names.add("::".join(prefix[:-1] + [path]) if prefix else path)
    for child in re.findall(r"(?<![:\w])(\w+)::", text):
        if "::".join(prefix + [child]) in modules:
            names.add("::".join(prefix + [child]))
    found = set()
    for name in names:
        while name and name not in modules:
            name = "::".join(name.split("::")[:-1])
        found.add(name or "crate")
    # A parent naming its children (declaring, re-exporting, calling them) is what a parent
    # does; only the other direction, and uses between siblings, can close a cycle.
    return {name for name in found if name != module and not is_descendant(name, module)}


def is_descendant(name: str, module: str) -> bool:
    return module == "crate" or name.startswith(module + "::")


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            result.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return result


def crate_cycles(crate: Path) -> list[list[str]]:
    src = crate / "src"
    files = {module_of(path, src): path for path in src.rglob("*.rs")}
    modules = set(files)
    graph = {module: named_modules(path.read_text(), module, modules) & modules for module, path in files.items()}
    return [component for component in components(graph) if len(component) > 1]


def main() -> int:
    crates = [Path(argument) for argument in sys.argv[1:]] or sorted(Path("crates").glob("*/"))
    found = 0
    for crate in crates:
        if not (crate / "src").is_dir():
            continue
        for component in crate_cycles(crate):
            found += 1
            print(f"{crate.name}: {' '.join(component)}")
    print(f"{found} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
