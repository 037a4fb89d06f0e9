/* megamoe — status codes.
 *
 * Every fallible call returns megamoe_status_t: 0 is success, MEGAMOE_INPROGRESS (1) is the
 * answer of a non-blocking call that has not finished, negative values are errors. The list is
 * one X-macro so the enum, the names and the strings can never drift apart.
 *
 * When a call fails, the library has logged one line at the place the error was decided and
 * stored the same text in a thread-local buffer: megamoe_last_error() returns it (the Python
 * binding puts it into the exception).
 */
#ifndef MEGAMOE_STATUS_H
#define MEGAMOE_STATUS_H

#include "megamoe/export.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

/* XX(name, value, description) */
#define MEGAMOE_STATUS_MAP(XX)                                                              \
    XX(OK, 0, "success")                                                                    \
    XX(INPROGRESS, 1, "operation in progress")                                              \
    XX(INVALID_ARGUMENT, -1, "invalid argument")                                            \
    XX(INVALID_STATE, -2, "invalid state for this operation")                               \
    XX(OUT_OF_MEMORY, -3, "out of memory")                                                  \
    XX(CAPACITY_OVERFLOW, -4, "receive capacity overflow")                                  \
    XX(TIMEOUT, -5, "timed out")                                                            \
    XX(PEER_LOST, -6, "a peer rank was lost")                                               \
    XX(CONFIG_MISMATCH, -7, "settings differ between ranks")                                \
    XX(UNSUPPORTED, -8, "unsupported")                                                      \
    XX(IO, -9, "input/output or system error")                                              \
    XX(NOT_FOUND, -10, "not found")                                                         \
    XX(INTERNAL, -11, "internal error")                                                     \
    XX(CALL_MISMATCH, -12, "ranks made different collective calls")

typedef enum megamoe_status {
#define MEGAMOE_STATUS_ENUM_(name, value, text) MEGAMOE_##name = (value),
    MEGAMOE_STATUS_MAP(MEGAMOE_STATUS_ENUM_)
#undef MEGAMOE_STATUS_ENUM_
} megamoe_status_t;

/* Human-readable description of a status ("receive capacity overflow"); never NULL. */
const char *megamoe_status_str(megamoe_status_t status);

/* Symbolic name of a status ("CAPACITY_OVERFLOW"); never NULL. */
const char *megamoe_status_name(megamoe_status_t status);

/* Text of the last error decided on the calling thread ("" when none). The pointer stays
 * valid until the next failing megamoe call on the same thread. */
const char *megamoe_last_error(void);

/* Forget the calling thread's last error. */
void megamoe_clear_last_error(void);

/* For bindings whose own argument checks (dtype, shape, device, ...) failed on this rank: the
 * next collective call made by this thread (a MegaMoeExperts forward, backward, close or
 * share, or an operator) does not run; it still takes part in its first exchange with this
 * error, so every rank of its group returns the same error at once ("rank R: <message>")
 * instead of waiting for the timeout, nothing moves and the layer stays usable. The call
 * consumes the error; megamoe_clear_next_call_error() drops an unused one. status must be an
 * error (< 0): INVALID_ARGUMENT otherwise. */
megamoe_status_t megamoe_fail_next_call(megamoe_status_t status, const char *message);
void megamoe_clear_next_call_error(void);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_STATUS_H */
