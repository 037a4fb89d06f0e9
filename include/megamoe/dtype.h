/* megamoe — element types and exact conversions.
 *
 * All conversions are bit-exact, deterministic and independent of the FPU mode:
 *  - fp32 -> bf16 / fp16: round half to even; Inf stays Inf; fp16 overflow gives Inf, fp16
 *    subnormals are produced exactly. NaN stays NaN with its sign and the payload bits that fit
 *    (the quiet bit is set only when those bits would be zero), so every bf16/fp16 pattern
 *    survives a round trip through fp32 unchanged.
 *  - fp32 -> fp8 (OCP FP8: e4m3fn has no Inf and max 448, e5m2 has Inf and max 57344): round half
 *    to even. Saturating variants clamp finite overflow (and Inf) to +-max; non-saturating
 *    variants give NaN (e4m3fn) or Inf (e5m2) on overflow. NaN input gives NaN.
 *  - e8m0 (MX scale byte): value 2^(b-127), 0xFF is NaN. Encoding from fp32 takes the exponent
 *    field (floor(log2|x|) + 127, i.e. mantissa ignored); 0 and subnormals give 0, NaN/Inf 0xFF.
 *  - fp32 -> int8: round half to even, saturating to [-128, 127]; NaN gives 0.
 */
#ifndef MEGAMOE_DTYPE_H
#define MEGAMOE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

typedef enum megamoe_dtype {
    MEGAMOE_DTYPE_FP32 = 0,
    MEGAMOE_DTYPE_BF16 = 1,
    MEGAMOE_DTYPE_FP16 = 2,
    MEGAMOE_DTYPE_FP8_E4M3FN = 3,
    MEGAMOE_DTYPE_FP8_E5M2 = 4,
    MEGAMOE_DTYPE_E8M0 = 5,
    MEGAMOE_DTYPE_INT8 = 6,
    MEGAMOE_DTYPE_UINT8 = 7,
    MEGAMOE_DTYPE_INT32 = 8,
    MEGAMOE_DTYPE_INT64 = 9,
    MEGAMOE_DTYPE_BOOL = 10,
    MEGAMOE_DTYPE_COUNT_ = 11
} megamoe_dtype_t;

/* Bytes per element (0 for an unknown type). */
size_t megamoe_dtype_size(megamoe_dtype_t dtype);
/* "bf16", "fp8_e4m3fn", ...; "unknown" otherwise. */
const char *megamoe_dtype_name(megamoe_dtype_t dtype);

uint16_t megamoe_fp32_to_bf16(float value);
float megamoe_bf16_to_fp32(uint16_t bits);
uint16_t megamoe_fp32_to_fp16(float value);
float megamoe_fp16_to_fp32(uint16_t bits);

uint8_t megamoe_fp32_to_fp8_e4m3fn(float value, int saturate);
uint8_t megamoe_fp32_to_fp8_e5m2(float value, int saturate);
uint8_t megamoe_bf16_to_fp8_e4m3fn(uint16_t bits, int saturate);
uint8_t megamoe_bf16_to_fp8_e5m2(uint16_t bits, int saturate);
float megamoe_fp8_e4m3fn_to_fp32(uint8_t bits);
float megamoe_fp8_e5m2_to_fp32(uint8_t bits);

uint8_t megamoe_fp32_to_e8m0(float value);
float megamoe_e8m0_to_fp32(uint8_t bits);

int8_t megamoe_fp32_to_int8(float value);

/* Convert n elements between fp32, bf16 and fp16 (any pair, same rules as the scalar
 * functions; vectorised). INVALID_ARGUMENT for other types. */
megamoe_status_t megamoe_convert(void *dst, megamoe_dtype_t dst_type, const void *src,
                                 megamoe_dtype_t src_type, size_t n);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_DTYPE_H */
