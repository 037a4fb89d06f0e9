/* megamoe — expert-parallel Mixture-of-Experts layers on CPUs.
 *
 * One include for the whole public API. Layers, lowest first:
 *   status.h log.h config.h dtype.h version.h   base services
 *   comm.h                                      communicator (private SHMEM runtime underneath)
 *   ops.h                                       MoeDistributeDispatchV2 / CombineV2 operators
 *   experts.h                                   MegaMoeExperts (fused MoE-FFN, fwd + bwd)
 *   reference.h                                 plain fp32 reference model (test oracle)
 *
 * Conventions: every fallible call returns megamoe_status_t; output parameters come last, end
 * in _p and are written only on success; objects are opaque handles with _create/_destroy;
 * params structs have a *_default() initialiser and NULL params mean defaults.
 */
#ifndef MEGAMOE_MEGAMOE_H
#define MEGAMOE_MEGAMOE_H

#include "megamoe/config.h"
#include "megamoe/dtype.h"
#include "megamoe/layout.h"
#include "megamoe/log.h"
#include "megamoe/status.h"
#include "megamoe/version.h"

#if __has_include("megamoe/comm.h")
#include "megamoe/comm.h"
#endif
#if __has_include("megamoe/ops.h")
#include "megamoe/ops.h"
#endif
#if __has_include("megamoe/experts.h")
#include "megamoe/experts.h"
#endif
#if __has_include("megamoe/reference.h")
#include "megamoe/reference.h"
#endif
#if __has_include("megamoe/prof.h")
#include "megamoe/prof.h"
#endif

#endif /* MEGAMOE_MEGAMOE_H */
