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
