"""The layer table of docs/architecture.md is the rule the code keeps.

The table is parsed here (so the document and the check cannot drift): every `#include` of a
file under src/<layer>/ names its own layer, a layer the row's "may use" column lists ("all
below" = every layer in the rows above), or a public header (megamoe/...); each layer's CMake
DEPS stay inside the same set. Inside base the object files call downwards only (no cycle
such as env -> log -> env), read from the built objects with nm.
"""
import os
import re
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.environ.get("MEGAMOE_BUILD_DIR") or os.path.join(REPO, "build", "release")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def layer_table():
    """[(layer, folder, allowed set or None)] in table order; None = not a src/ layer."""
    text = open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8").read()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("layer", "") or set(cells[0]) <= set("-"):
            continue
        layer, folder, _owns, may_use = cells
        rows.append((layer, folder.strip("`"), may_use))
    assert rows, "docs/architecture.md has no layer table under '## Layers'"
    names = {r[0] for r in rows}
    table, below = [], []
    for layer, folder, may_use in rows:
        if not folder.startswith("src/"):
            table.append((layer, folder, None))
            continue
        allowed = set()
        for item in may_use.split(","):
            word = re.sub(r"\(.*?\)", "", item).strip().strip("`")
            if word.startswith("all below"):
                allowed |= set(below)
            elif word in names:
                allowed.add(word)
            # anything else is outside the repository's layers (libc, UCX, oneDNN, ...)
        assert folder == f"src/{layer}/", f"row {layer}: folder {folder} is not src/{layer}/"
        table.append((layer, folder, allowed))
        below.append(layer)
    return table


def src_layers():
    return {layer: allowed for layer, _f, allowed in layer_table() if allowed is not None}


def test_every_src_folder_is_a_row_of_the_table():
    folders = {d for d in os.listdir(os.path.join(REPO, "src"))
               if os.path.isdir(os.path.join(REPO, "src", d))}
    assert folders == set(src_layers()), "src/ folders and the layer table differ"


def include_violations(layer, name, text, layers):
    """The includes of file src/<layer>/<name> (contents text) that the table forbids."""
    allowed, bad = layers[layer], []
    for inc in INCLUDE.findall(text):
        target = os.path.normpath(os.path.join(layer, inc)) if inc.startswith("..") else inc
        top = target.split("/", 1)[0] if "/" in target else None
        if top is None:
            ok = os.path.exists(os.path.join(REPO, "src", layer, inc))  # the layer's own file
        elif top == "megamoe":
            ok = True  # the public API
        elif top in layers:
            ok = top == layer or top in allowed
        else:
            ok = False
        if not ok:
            bad.append(f"src/{layer}/{name}: #include \"{inc}\" "
                       f"({layer} may use {sorted(allowed) or 'nothing in src'})")
    return bad


def test_includes_respect_the_layer_table():
    layers = src_layers()
    bad = []
    for layer in layers:
        folder = os.path.join(REPO, "src", layer)
        for name in sorted(os.listdir(folder)):
            if name.endswith((".c", ".h", ".cpp")):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                bad += include_violations(layer, name, text, layers)
    assert not bad, "includes against docs/architecture.md's layer table:\n" + "\n".join(bad)


def test_the_check_rejects_what_the_table_forbids():
    layers = src_layers()
    assert layers["base"] == set()
    assert {"base", "shmem", "kernels", "ops", "multicore"} <= layers["moe"]
    assert include_violations("kernels", "x.c", '#include "base/error.h"\n', layers) == []
    assert include_violations("kernels", "x.c", '#include "megamoe/ops.h"\n', layers) == []
    assert include_violations("kernels", "x.c", '#include "gemm_impl.h"\n', layers) == []
    for text in ('#include "ops/v2_internal.h"\n', '#  include "../moe/moe_rows.h"\n',
                 '#include "no_such_file.h"\n', '#include "tests/harness/harness.h"\n'):
        assert include_violations("kernels", "x.c", text, layers), text
    assert include_violations("base", "x.c", '#include "kernels/gemm.h"\n', layers)


def test_cmake_deps_respect_the_layer_table():
    bad = []
    for layer, allowed in src_layers().items():
        cml = os.path.join(REPO, "src", layer, "CMakeLists.txt")
        if not os.path.exists(cml):
            continue
        for call in re.findall(r"megamoe_add_layer\(([^)]*)\)", open(cml).read()):
            words = call.split()
            deps = words[words.index("DEPS") + 1:] if "DEPS" in words else []
            if "LIBS" in deps:
                deps = deps[:deps.index("LIBS")]
            bad += [f"src/{layer}/CMakeLists.txt: DEPS {d}" for d in deps if d not in allowed]
    assert not bad, "CMake DEPS against the layer table:\n" + "\n".join(bad)


def base_objects():
    d = os.path.join(BUILD, "src", "base", "CMakeFiles", "megamoe_base_obj.dir")
    if not os.path.isdir(d):
        pytest.fail(f"{d} not found: build first ('make build')")
    return {f[:-len(".c.o")]: os.path.join(d, f) for f in os.listdir(d) if f.endswith(".c.o")}


def nm(path, *flags):
    out = subprocess.run(["nm", *flags, path], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_base_files_call_downwards_only():
    objs = base_objects()
    defined = {}
    for stem, path in objs.items():
        for sym in nm(path, "--defined-only"):
            defined[sym] = stem
    calls = {stem: {defined[s] for s in nm(path, "-u") if s in defined} - {stem}
             for stem, path in objs.items()}
    # depth-first search for a cycle
    state, cycle = {}, []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(calls[node]):
            if state.get(nxt) == 1:
                cycle.extend(trail[trail.index(nxt):] + [node, nxt] if nxt in trail else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, trail + [node]):
                return True
        state[node] = 2
        return False

    for node in sorted(calls):
        if state.get(node) is None and visit(node, []):
            break
    assert not cycle, f"src/base calls in a cycle: {' -> '.join(cycle)}"
    assert calls["status"] == set() and "env" not in calls["log"]
