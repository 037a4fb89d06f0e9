/* megamoe — version. */
#ifndef MEGAMOE_VERSION_H
#define MEGAMOE_VERSION_H

#include "megamoe/export.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

#define MEGAMOE_VERSION_MAJOR 0
#define MEGAMOE_VERSION_MINOR 1
#define MEGAMOE_VERSION_PATCH 0
#define MEGAMOE_VERSION_STRING "0.1.0"
/* Bump on any incompatible change of a public struct or signature. */
#define MEGAMOE_ABI_VERSION 1

/* Version of the library actually loaded ("0.1.0"). */
const char *megamoe_version(void);
/* ABI version of the loaded library; compare with MEGAMOE_ABI_VERSION. */
int megamoe_abi_version(void);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_VERSION_H */
