"""Exceptions raised for every non-OK megamoe status.

Every error is a :class:`MegaMoeError` (``status``, ``name``, the library's message naming the
fix). Two statuses have their own subclasses: ``INVALID_ARGUMENT`` is also a ``ValueError``
(:class:`InvalidArgumentError`; on the rank that passed an argument of the wrong kind also a
``TypeError``, :class:`InvalidArgumentTypeError`), ``CALL_MISMATCH`` — the ranks made different
collective calls (forward, backward, close, share_execution_resources, the operators) or made
them in a different order — is :class:`CallMismatchError`.
"""
from . import _lib

_L = _lib.lib
_L.megamoe_fail_next_call.restype = _lib.c_int
_L.megamoe_fail_next_call.argtypes = [_lib.c_int, _lib.c_char_p]
_L.megamoe_clear_next_call_error.restype = None
_L.megamoe_clear_next_call_error.argtypes = []

INVALID_ARGUMENT = -1
CALL_MISMATCH = -12


class MegaMoeError(RuntimeError):
    """A megamoe call failed. ``status`` is the C status code, ``name`` its symbolic name
    (``"CAPACITY_OVERFLOW"``), and the message is the library's explanation with the fix."""

    def __new__(cls, status=None, message=None):
        # MegaMoeError(status) picks the subclass of the status, so `except ValueError` sees
        # argument errors raised on behalf of a peer rank as well
        if cls is MegaMoeError and isinstance(status, int):
            cls = _BY_STATUS.get(int(status), MegaMoeError)
        return super().__new__(cls)

    def __init__(self, status, message=None):
        self.status = int(status)
        self.name = status_name(status)
        if message is None:
            message = _L.megamoe_last_error().decode(errors="replace") or status_str(status)
        super().__init__(message)


class InvalidArgumentError(MegaMoeError, ValueError):
    """INVALID_ARGUMENT: an argument of this or another rank broke a rule (named in the text)."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """INVALID_ARGUMENT for an argument of the wrong kind (not a tensor): on the rank that
    passed it also a TypeError."""


class CallMismatchError(MegaMoeError):
    """CALL_MISMATCH: the ranks made different collective calls; the text names what each rank
    called. Nothing ran; calls made in the same order on every rank work again."""


_BY_STATUS = {INVALID_ARGUMENT: InvalidArgumentError, CALL_MISMATCH: CallMismatchError}


def status_str(code):
    """Human-readable description of a status code."""
    return _L.megamoe_status_str(int(code)).decode()


def status_name(code):
    """Symbolic name of a status code ("PEER_LOST")."""
    return _L.megamoe_status_name(int(code)).decode()


def check(status):
    """Raise MegaMoeError for a non-OK status (INPROGRESS, 1, is not an error; any other
    positive value is no status at all and raises too, never passes as success)."""
    if status < 0 or status > 1:
        raise MegaMoeError(status)
    return status


def fail_next_call(message, status=INVALID_ARGUMENT):
    """A check of this binding failed on this rank only: make the next collective C call of
    this thread take part in its first exchange with this error instead of running, so every
    rank raises the same error at once (instead of the others waiting for the timeout)."""
    check(_L.megamoe_fail_next_call(int(status), str(message).encode(errors="replace")))


def clear_next_call_error():
    _L.megamoe_clear_next_call_error()
