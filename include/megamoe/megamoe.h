/* megamoe — expert-parallel Mixture-of-Experts layers on CPUs.
 *
 * One include for the whole public API. Layers, lowest first:
 *   status.h log.h config.h dtype.h version.h   base services
 *   comm.h                                      communicator (private SHMEM runtime underneath)
 *   symm.h                                      symmetric memory of a communicator (shmem module)
 *   layout.h                                    expert weight layout conversions
 *   ops.h                                       MoeDistributeDispatchV2 / CombineV2 operators
 *   companion.h                                 torch_npu's companion operators (gmm, routing)
 *   experts.h                                   MegaMoeExperts (fused MoE-FFN, fwd + bwd)
 *   prof.h                                      MegaKernel profiling and trace tools
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
#include "megamoe/log.h"
#include "megamoe/status.h"
#include "megamoe/version.h"

#include "megamoe/comm.h"
#include "megamoe/symm.h"
#include "megamoe/layout.h"
#include "megamoe/ops.h"
#include "megamoe/companion.h"
#include "megamoe/experts.h"
#include "megamoe/serve.h"
#include "megamoe/prof.h"
#include "megamoe/reference.h"

#endif /* MEGAMOE_MEGAMOE_H */
