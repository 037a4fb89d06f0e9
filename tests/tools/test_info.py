"""megamoe info: the configuration listing, strict validation, docs/env.md in sync."""
import os

from conftest import REPO, run_megamoe

VARIABLES = [
    "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "HYPER_PARALLEL_SHMEM_HEAP_SIZE",
    "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", "HYPER_PARALLEL_SHMEM_LOG_LEVEL", "MEGAMOE_LOG_LEVEL",
    "MEGAMOE_JOB_TOKEN", "MEGAMOE_GEMM", "MEGAMOE_CHECK", "MEGAMOE_PROFILE",
]


def test_info_config_lists_every_variable(megamoe_bin):
    r = run_megamoe(["info", "--config"], env_extra={"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M"})
    assert r.returncode == 0, r.stderr
    for v in VARIABLES:
        assert v in r.stdout
    line = next(l for l in r.stdout.splitlines() if l.startswith("HYPER_PARALLEL_SHMEM_HEAP_SIZE"))
    assert "256M" in line and "default: 1G" in line


def test_bad_log_level_exits_2_naming_the_variable(megamoe_bin):
    r = run_megamoe(["info"], env_extra={"MEGAMOE_LOG_LEVEL": "loud"})
    assert r.returncode == 2
    assert "MEGAMOE_LOG_LEVEL" in r.stderr
    assert "trace|debug|info|warn|error|off" in r.stderr


def test_bad_size_exits_2(megamoe_bin):
    r = run_megamoe(["info"], env_extra={"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "lots"})
    assert r.returncode == 2
    assert "HYPER_PARALLEL_SHMEM_HEAP_SIZE" in r.stderr


def test_docs_env_md_is_the_generated_table(megamoe_bin):
    r = run_megamoe(["info", "--config", "--markdown"])
    assert r.returncode == 0
    with open(os.path.join(REPO, "docs", "env.md")) as f:
        doc = f.read()
    assert r.stdout in doc, "docs/env.md is stale: run 'make docs'"


def test_info_shows_host(megamoe_bin):
    r = run_megamoe(["info"])
    assert r.returncode == 0
    assert "cpu:" in r.stdout and "avx512" in r.stdout


def test_every_variable_read_is_in_the_table(megamoe_bin):
    """The C library reads the environment only through src/base/env.h and the Python binding
    only names variables the table documents, so docs/env.md lists everything a user can set."""
    import re
    r = run_megamoe(["info", "--config"])
    assert r.returncode == 0
    listed = set(re.findall(r"^([A-Z][A-Z0-9_]+) ", r.stdout, re.M))
    read = set()
    for base, pattern in ((os.path.join(REPO, "python", "megamoe"),
                           r"os\.environ(?:\.get\(|\[)\s*\"([A-Z0-9_]+)\"|\"([A-Z0-9_]+)\" (?:not )?in os\.environ"),
                          (os.path.join(REPO, "src"), r"getenv\(\"([A-Z0-9_]+)\"\)")):
        for root, _, files in os.walk(base):
            for name in files:
                if not name.endswith((".py", ".c", ".h")) or name == "env.c":
                    continue
                with open(os.path.join(root, name)) as f:
                    for m in re.finditer(pattern, f.read()):
                        read.update(g for g in m.groups() if g)
    assert read, "no variable found: the patterns are stale"
    # PYTHONPATH is only extended for the children megamoe.torchrun starts, never a setting
    missing = sorted(read - listed - {"PYTHONPATH"})
    assert not missing, f"read but not in src/base/env_table.h (docs/env.md): {missing}"
