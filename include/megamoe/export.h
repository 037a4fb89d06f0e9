/* megamoe — symbol export.
 *
 * libmegamoe.so is built with hidden visibility: only what the public headers declare between
 * MEGAMOE_API_BEGIN and MEGAMOE_API_END (the megamoe_* API) is exported; the internal mm_*
 * functions are not, so they can change without an ABI bump (README "ABI rule"). A
 * declaration outside such a block can be exported alone with MEGAMOE_API.
 */
#ifndef MEGAMOE_EXPORT_H
#define MEGAMOE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define MEGAMOE_API __attribute__((visibility("default")))
#define MEGAMOE_API_BEGIN _Pragma("GCC visibility push(default)")
#define MEGAMOE_API_END _Pragma("GCC visibility pop")
#else
#define MEGAMOE_API
#define MEGAMOE_API_BEGIN
#define MEGAMOE_API_END
#endif

#endif /* MEGAMOE_EXPORT_H */
