#include "megamoe/version.h"

const char *megamoe_version(void) { return MEGAMOE_VERSION_STRING; }
int megamoe_abi_version(void) { return MEGAMOE_ABI_VERSION; }
