/* The runtime rank mask of a symmetric buffer: ranks of its group that the survivors of a loss
 * agreed are gone (shmem/survive.h) are masked at every call, on every survivor, without the
 * caller doing anything (docs/serve.md "Serving through a lost rank").
 *
 * The call in flight at the loss fails with PEER_LOST on every survivor. The next call first
 * acknowledges the loss (it waits until the survivors agreed on who is gone; a rank on the side
 * that stops gets PEER_LOST here, every time), then sets the lost members' entries of the mask
 * (creating it: query_mask_buffer shows them; clean_mask_buffer or update_mask_buffer cannot
 * bring a lost rank back, the next call masks it again) and drops the call-order groups whose
 * team holds a lost member (their teams are destroyed locally). The call then runs among the
 * unmasked ranks exactly as with a mask the caller set: pairs routed to a lost rank's experts
 * contribute nothing and are not counted. The buffer's symmetric rows stay where they are (the
 * survivors' copies are unaffected), so nothing is allocated or copied per loss.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "serve/serve_impl.h"
#include "serve/serve_o1.h"

megamoe_status_t mm_sv_runtime_mask(megamoe_symm_buffer_t *b)
{
    MM_CHECK(mm_shmem_recover());
    int lost = 0;
    for (int i = 0; i < b->W; i++) lost |= !mm_shmem_pe_alive(b->pes[i]);
    if (!lost) return MEGAMOE_OK;
    /* the O1 executor's team holds a lost rank: its signal area is freed locally (the loss is
     * acknowledged), every survivor the same; masked calls take the host path anyway */
    if (mm_sv_o1_lost(b)) (void)mm_sv_o1_destroy(b, 1);
    int32_t *mask = NULL;
    MM_CHECK(megamoe_symm_buffer_mask(b, &mask));
    for (int i = 0; i < b->W; i++)
        if (!mm_shmem_pe_alive(b->pes[i])) mask[i] = 1;
    for (int i = 0; i < MM_SV_MAX_MASK_GROUPS; i++) {
        mm_sv_order_t *o = &b->orders[i];
        if (!o->key || mm_shmem_team_lost_member(o->team) < 0) continue;
        mm_call_group_unregister(&o->calls);
        /* local: a team with a lost member ends on each survivor alone */
        if (o->own_team) (void)mm_shmem_team_destroy(o->team);
        memset(o, 0, sizeof *o);
    }
    return MEGAMOE_OK;
}
