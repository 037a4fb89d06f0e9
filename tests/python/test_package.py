"""The Python skeleton: loading, version, status strings, exceptions."""
import ctypes

import pytest

import megamoe
from megamoe import _lib


def test_version_matches_library():
    assert megamoe.__version__ == _lib.lib.megamoe_version().decode()
    assert megamoe.__version__.count(".") == 2


def test_status_strings():
    assert megamoe.status_name(0) == "OK"
    assert megamoe.status_name(-4) == "CAPACITY_OVERFLOW"
    assert megamoe.status_str(-6) == "a peer rank was lost"


def test_non_ok_status_raises_with_library_message():
    f32 = (ctypes.c_float * 4)()
    out = (ctypes.c_int8 * 4)()
    st = _lib.lib.megamoe_convert(ctypes.addressof(out), 6, ctypes.addressof(f32), 0, 4)
    with pytest.raises(megamoe.MegaMoeError) as info:
        megamoe.check(st)
    assert info.value.name == "INVALID_ARGUMENT"
    assert info.value.status == st
    assert "fp32, bf16 and fp16" in str(info.value)


def test_hyper_parallel_import_line():
    from hyper_parallel.core import multicore
    assert multicore.__version__ == megamoe.__version__
