/* Shared helpers of the companion operators (companion_util.h) and the public group-list
 * decoder megamoe_group_list_counts. */
#include "companion_util.h"

#include <stdio.h>

const char *mm_cx_shape_str(const megamoe_tensor_t *t, char *buf, size_t len)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                                 (long long)t->shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

megamoe_status_t mm_cx_check_shape(const char *fn, const char *name, const megamoe_tensor_t *t,
                                   int ndim, const int64_t *want)
{
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = want == NULL || want[i] < 0 || t->shape[i] == want[i];
    if (ok) return MEGAMOE_OK;
    char got[96], exp[96] = "[";
    size_t used = 1;
    for (int i = 0; i < ndim && used < sizeof exp; i++) {
        if (want && want[i] >= 0)
            used += (size_t)snprintf(exp + used, sizeof exp - used, "%s%lld", i ? ", " : "",
                                     (long long)want[i]);
        else
            used += (size_t)snprintf(exp + used, sizeof exp - used, "%s*", i ? ", " : "");
    }
    if (used < sizeof exp) snprintf(exp + used, sizeof exp - used, "]");
    return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s has shape %s, expected %s", fn, name,
                    mm_cx_shape_str(t, got, sizeof got), exp);
}

megamoe_status_t mm_cx_group_counts(const char *fn, const megamoe_tensor_t *gl, int64_t type,
                                    int64_t groups, int64_t max_rows, int64_t *counts,
                                    int64_t *total_p)
{
    if (gl->dtype != MEGAMOE_DTYPE_INT64 && gl->dtype != MEGAMOE_DTYPE_INT32)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: group_list must be int64 (or int32), got %s",
                        fn, megamoe_dtype_name(gl->dtype));
    for (int64_t g = 0; g < groups; g++) counts[g] = 0;
    int64_t total = 0;
    if (type == 0 || type == 1) {
        if (gl->ndim != 1)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: group_list of type %lld must be 1-D, got %d dims", fn,
                            (long long)type, gl->ndim);
        int64_t n = gl->shape[0];
        if (n > groups)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: group_list has %lld entries for %lld groups (weights)", fn,
                            (long long)n, (long long)groups);
        int64_t prev = 0;
        for (int64_t g = 0; g < n; g++) {
            int64_t v = mm_cx_index(gl->data, gl->dtype, g);
            if (type == 0) {
                if (v < prev)
                    return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                    "%s: group_list_type 0 (cumulative) decreases at entry %lld "
                                    "(%lld after %lld); pass group_list_type=1 for counts",
                                    fn, (long long)g, (long long)v, (long long)prev);
                counts[g] = v - prev;
                prev = v;
            } else {
                if (v < 0)
                    return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                    "%s: group_list count %lld of group %lld is negative", fn,
                                    (long long)v, (long long)g);
                counts[g] = v;
            }
            total += counts[g];
        }
    } else if (type == 2) {
        if (gl->ndim != 2 || gl->shape[1] != 2)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: group_list of type 2 must be [E, 2] (group id, count) pairs", fn);
        for (int64_t r = 0; r < gl->shape[0]; r++) {
            int64_t id = mm_cx_index(gl->data, gl->dtype, 2 * r);
            int64_t c = mm_cx_index(gl->data, gl->dtype, 2 * r + 1);
            if (c == 0) break; /* the used pairs come first */
            if (c < 0 || id < 0 || id >= groups)
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "%s: group_list pair %lld is (id %lld, count %lld); ids must be in "
                                "[0, %lld) and counts >= 0", fn, (long long)r, (long long)id,
                                (long long)c, (long long)groups);
            counts[id] += c;
            total += c;
        }
    } else {
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: group_list_type %lld; use 0 (cumsum), 1 (counts) or 2 (id, count)",
                        fn, (long long)type);
    }
    if (max_rows >= 0 && total > max_rows)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: group_list covers %lld rows but x has only %lld", fn,
                        (long long)total, (long long)max_rows);
    if (total_p) *total_p = total;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_group_list_counts(const megamoe_tensor_t *group_list,
                                           int64_t group_list_type, int64_t num_groups,
                                           int64_t max_rows, int64_t *counts, int64_t *total_p)
{
    const char *fn = "megamoe_group_list_counts";
    if (group_list == NULL || group_list->data == NULL || (num_groups > 0 && counts == NULL) ||
        num_groups < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL group_list or counts, or %lld groups",
                        fn, (long long)num_groups);
    return mm_cx_group_counts(fn, group_list, group_list_type, num_groups, max_rows, counts,
                              total_p);
}
