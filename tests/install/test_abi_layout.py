"""The ABI scheme of the public structs (include/megamoe/version.h): the committed layouts
hold, the check catches a change outside the scheme, the library's table covers every public
struct, and every ctypes mirror matches its C struct field by field."""
import ctypes
import os
import re
import subprocess

import pytest

import abi_layout as al
from conftest import BUILD

LIB = os.path.join(BUILD, "src", "libmegamoe.so")


@pytest.fixture(scope="module")
def current():
    if not os.path.exists(LIB):
        pytest.fail(f"{LIB} not built; run 'make build'")
    return al.clang_layouts(al.public_structs(), al.library_min_sizes(LIB))


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(LIB)
    for f in (lib.megamoe_struct_size, lib.megamoe_struct_min_size):
        f.restype = ctypes.c_int64
        f.argtypes = [ctypes.c_char_p]
    return lib


def test_layouts_keep_the_scheme_and_are_recorded(current):
    rec_abi, recorded = al.parse_record(open(al.RECORD, encoding="utf-8").read())
    problems = al.compare(recorded, current, rec_abi, al.abi_version())
    assert not problems, "\n".join(problems)


def test_the_check_refuses_changes_outside_the_scheme(current):
    abi = al.abi_version()
    rec = {t: dict(v, fields=list(v["fields"])) for t, v in current.items()}

    def problems_after(edit):
        cur = {t: dict(v, fields=list(v["fields"])) for t, v in rec.items()}
        edit(cur)
        return al.compare(rec, cur, abi, abi)

    def swap(cur):  # two fields of an extensible struct trade places
        f = cur["megamoe_experts_params_t"]["fields"]
        f[1], f[2] = (f[1][0], f[2][1], f[2][2]), (f[2][0], f[1][1], f[1][2])

    def retype(cur):
        f = cur["megamoe_experts_input_t"]["fields"]
        f[3] = (f[3][0], "int64_t", f[3][2])

    def grow_frozen(cur):
        t = cur["megamoe_experts_weights_t"]
        t["fields"].append((t["size"], "int", "extra"))
        t["size"] += 8

    def remove(cur):
        del cur["megamoe_comm_params_t"]

    def lose_size_field(cur):
        cur["megamoe_dispatch_v2_args_t"]["kind"] = "frozen"

    for edit in (swap, retype, grow_frozen, remove, lose_size_field):
        found = problems_after(edit)
        assert found and all("ABI change" in p for p in found), (edit.__name__, found)

    def append(cur):  # within the scheme, but it must be recorded
        t = cur["megamoe_experts_params_t"]
        t["fields"].append((t["size"], "int64_t", "max_local_num_tokens"))
        t["size"] += 8

    found = problems_after(append)
    assert len(found) == 1 and "within the scheme" in found[0], found
    found = al.compare(rec, rec, abi - 1, abi)
    assert found and "make abi-layout" in found[0]


def test_every_public_struct_has_its_row_in_the_library(current, lib):
    for t, lay in current.items():
        assert lib.megamoe_struct_size(t.encode()) == lay["size"], t
        low = lib.megamoe_struct_min_size(t.encode())
        if lay["kind"] == "frozen":
            assert low == 0, t
        else:  # the minimum is the end of one of its fields, never past the struct
            ends = [off for off, _typ, _n in lay["fields"][1:]] + [lay["size"]]
            assert 0 < low <= lay["size"], t
            assert any(low <= e for e in ends), t
    assert lib.megamoe_struct_size(b"megamoe_no_such_t") == -1
    assert lib.megamoe_struct_min_size(b"megamoe_no_such_t") == -1


def test_extensible_structs_have_init_and_an_inline_default(current):
    headers = "".join(open(os.path.join(al.INCLUDE, "megamoe", h), encoding="utf-8").read()
                      for h in os.listdir(os.path.join(al.INCLUDE, "megamoe")))
    exported = subprocess.run(["nm", "-D", "--defined-only", LIB], capture_output=True,
                              text=True, check=True).stdout.split()
    for t, lay in current.items():
        stem = t[:-2]
        if lay["kind"] == "extensible":
            assert re.search(rf"static inline {t} {stem}_default\(void\)", headers), t
            assert f"{stem}_init" in exported, t
            assert f"{stem}_default" not in exported, t  # the caller's sizeof, never the library's
        elif lay["kind"] == "caller-sized":
            assert re.search(rf"sizeof \*\(\w+\)\)", headers), t


def test_ctypes_mirrors_match_their_c_structs(current):
    import megamoe  # noqa: F401  (imports every module that declares mirrors)
    import megamoe.ops  # noqa: F401
    import megamoe.profiler  # noqa: F401
    from megamoe import _lib
    assert _lib.ABI_VERSION == al.abi_version()
    assert len(_lib.MIRRORS) >= 15, sorted(_lib.MIRRORS)
    for t, cls in _lib.MIRRORS.items():
        lay = current[t]
        names = [n for n, *_ in cls._fields_]
        assert names == [f[2] for f in lay["fields"]], t
        for off, _typ, name in lay["fields"]:
            assert getattr(cls, name).offset == off, (t, name)
        assert ctypes.sizeof(cls) == lay["size"], t


def test_a_stale_mirror_fails_the_import():
    from megamoe import _lib

    class Stale(ctypes.Structure):  # the ABI-1 layout: no struct_size
        _fields_ = [("local_num_tokens", ctypes.c_int64), ("hidden_size", ctypes.c_int64)]

    with pytest.raises(ImportError, match="megamoe_experts_params_t"):
        _lib.mirror("megamoe_experts_params_t")(Stale)


def test_soname_follows_the_abi_version():
    out = subprocess.run(["readelf", "-d", LIB], capture_output=True, text=True,
                         check=True).stdout
    assert f"[libmegamoe.so.{al.abi_version()}]" in out
    assert al.abi_version() >= 2  # the structs grew after .1 (issue 30)
