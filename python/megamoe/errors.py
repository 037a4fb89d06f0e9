"""Exceptions raised for every non-OK megamoe status."""
from . import _lib


class MegaMoeError(RuntimeError):
    """A megamoe call failed. ``status`` is the C status code, ``name`` its symbolic name
    (``"CAPACITY_OVERFLOW"``), and the message is the library's explanation with the fix."""

    def __init__(self, status, message=None):
        self.status = int(status)
        self.name = status_name(status)
        if message is None:
            message = _lib.lib.megamoe_last_error().decode(errors="replace") or status_str(status)
        super().__init__(message)


def status_str(code):
    """Human-readable description of a status code."""
    return _lib.lib.megamoe_status_str(int(code)).decode()


def status_name(code):
    """Symbolic name of a status code ("PEER_LOST")."""
    return _lib.lib.megamoe_status_name(int(code)).decode()


def check(status):
    """Raise MegaMoeError for a non-OK status (INPROGRESS, 1, is not an error)."""
    if status < 0:
        raise MegaMoeError(status)
    return status
