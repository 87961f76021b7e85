/* expert_pool_decode.h: the weight decoders of kernels/expert_pool.c (included there, after its includes and
 * STRATA_AVX2): one row of any type strata reads -> float32, exactly as
 * gguf.quants.dequantize computes it (the same float32 operations in the same order; the file is compiled with
 * -ffp-contract=off). These scalar decoders are the no-SIMD path and the layout reference; the SIMD builds decode
 * through the fused kernels' group decoders (expert_pool_groups.h, reached through expert_pool_dispatch.h, which
 * picks the kernel per type).
 */
#ifndef STRATA_EXPERT_POOL_DECODE_H
#define STRATA_EXPERT_POOL_DECODE_H

/* the block table, the scalar helpers and block_of (shared with the fused kernels) */
#include "expert_pool_base.h"
#include "expert_pool_dispatch.h"

static void dequant_block(int type, const uint8_t *b, float *y) {
    switch (type) {
    case T_Q4_0: {
        const float d = rdh(b);
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)((int)(b[2 + l] & 0xF) - 8);
            y[l + 16] = d * (float)((int)(b[2 + l] >> 4) - 8);
        }
        break;
    }
    case T_Q4_1: {
        const float d = rdh(b), m = rdh(b + 2);
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)(b[4 + l] & 0xF) + m;
            y[l + 16] = d * (float)(b[4 + l] >> 4) + m;
        }
        break;
    }
    case T_Q5_0: {
        const float d = rdh(b);
        const uint32_t qh = rd32(b + 2);
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)((int)((b[6 + l] & 0xF) | (((qh >> l) & 1) << 4)) - 16);
            y[l + 16] = d * (float)((int)((b[6 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16);
        }
        break;
    }
    case T_Q5_1: {
        const float d = rdh(b), m = rdh(b + 2);
        const uint32_t qh = rd32(b + 4);
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)((b[8 + l] & 0xF) | (((qh >> l) & 1) << 4)) + m;
            y[l + 16] = d * (float)((b[8 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) + m;
        }
        break;
    }
    case T_Q8_0: {
        const float d = rdh(b);
        for (int l = 0; l < 32; l++) y[l] = (float)(int8_t)b[2 + l] * d;
        break;
    }
    case T_IQ4_NL: {
        const float d = rdh(b);
        for (int l = 0; l < 32; l++) y[l] = d * (float)kvalues_iq4nl[(b[2 + l % 16] >> (4 * (l / 16))) & 0xF];
        break;
    }
    case T_Q2_K: { /* scales[16] qs[64] d dmin */
        const uint8_t *sc = b, *qs = b + 16;
        const float d = rdh(b + 80), dmin = rdh(b + 82);
        for (int e = 0; e < QK_K; e++) {
            const int half = e / 128, r = e % 128, s = r / 32, l = r % 32, sub = e / 16;
            const float dl = d * (float)(sc[sub] & 0xF), ml = dmin * (float)(sc[sub] >> 4);
            y[e] = dl * (float)((qs[half * 32 + l] >> (2 * s)) & 3) - ml;
        }
        break;
    }
    case T_Q3_K: { /* hmask[32] qs[64] scales[12] d */
        const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
        const float d = rdh(b + 108);
        for (int e = 0; e < QK_K; e++) {
            const int sub = e / 16;
            const int lo = sub < 8 ? (sc[sub] & 0xF) : (sc[sub - 8] >> 4);
            const int hi = (sc[8 + sub % 4] >> (2 * (sub / 4))) & 3;
            const float dl = d * (float)((int8_t)(lo | (hi << 4)) - 32);
            const int half = e / 128, r = e % 128, s = r / 32, l = r % 32;
            const int ql = (qs[half * 32 + l] >> (2 * s)) & 3;
            const int qh = ((hm[e % 32] >> (e / 32)) & 1) ^ 1;
            y[e] = dl * (float)(ql - (qh << 2));
        }
        break;
    }
    case T_Q4_K: case T_Q5_K: { /* d dmin scales[12] [qh[32]] qs[128] */
        const float d = rdh(b), dmin = rdh(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (type == T_Q4_K ? 16 : 48);
        for (int j = 0; j < 8; j++) {
            uint8_t s, m;
            get_scale_min_k4(sc, j, &s, &m);
            const float dd = d * (float)s, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF;
                if (type == T_Q5_K) q |= ((qh[l] >> j) & 1) << 4;
                y[j * 32 + l] = dd * (float)q - dm;
            }
        }
        break;
    }
    case T_Q6_K: { /* ql[128] qh[64] scales[16] d */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = rdh(b + 208);
        for (int e = 0; e < QK_K; e++) {
            const int c = e / 32, l = e % 32, h = c / 4, s = (c % 4) / 2, p = (c % 2) * 32 + l;
            const int lo = (ql[h * 64 + p] >> (4 * s)) & 0xF;
            const int hi = (qh[h * 32 + l] >> (2 * (c % 4))) & 3;
            y[e] = (d * (float)sc[e / 16]) * (float)((int8_t)(lo | (hi << 4)) - 32);
        }
        break;
    }
    case T_IQ4_XS: { /* d scales_h(u16) scales_l[4] qs[128] */
        const float d = rdh(b);
        const uint16_t sh = rd16(b + 2);
        const uint8_t *sl = b + 4, *qs = b + 8;
        for (int j = 0; j < 8; j++) {
            const int lo = (sl[j / 2] >> (4 * (j % 2))) & 0xF, hi = (sh >> (2 * j)) & 3;
            const float dl = d * (float)((int8_t)(lo | (hi << 4)) - 32);
            for (int l = 0; l < 32; l++)
                y[j * 32 + l] = dl * (float)kvalues_iq4nl[(qs[j * 16 + l % 16] >> (4 * (l / 16))) & 0xF];
        }
        break;
    }
    /* i-quants: value = (scale * grid) * sign, or scale * (grid + delta), rounded as gguf's numpy rounds them */
    case T_IQ2_XXS: { /* d, per 32: u32 (4 grid ids), u32 (4 x 7-bit sign ids, 4-bit scale) */
        const float d = rdh(b);
        for (int g = 0; g < 8; g++) {
            const uint32_t a0 = rd32(b + 2 + 8 * g), a1 = rd32(b + 6 + 8 * g);
            const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const int8_t *gr = grid_iq2xxs[(a0 >> (8 * l)) & 0xFF];
                const uint8_t sg = ksigns_iq2xs[(a1 >> (7 * l)) & 127];
                for (int k = 0; k < 8; k++) y[32 * g + 8 * l + k] = db * (float)gr[k] * ((sg >> k) & 1 ? -1.0f : 1.0f);
            }
        }
        break;
    }
    case T_IQ2_XS: { /* d, qs u16[32] (9-bit grid id, 7-bit sign id), scales[8] (4 bits per 16) */
        const float d = rdh(b);
        for (int i = 0; i < 32; i++) {
            const uint16_t q = rd16(b + 2 + 2 * i);
            const float db = d * (0.5f + (float)((b[66 + i / 4] >> (4 * ((i / 2) % 2))) & 0xF)) * 0.25f;
            const int8_t *gr = grid_iq2xs[q & 511];
            const uint8_t sg = ksigns_iq2xs[q >> 9];
            for (int k = 0; k < 8; k++) y[8 * i + k] = db * (float)gr[k] * ((sg >> k) & 1 ? -1.0f : 1.0f);
        }
        break;
    }
    case T_IQ2_S: { /* d, qs[32] (id low bits), signs[32], qh[8] (2 high id bits each), scales[8] */
        const float d = rdh(b);
        for (int i = 0; i < 32; i++) {
            const int id = b[2 + i] | (((b[66 + i / 4] >> (2 * (i % 4))) & 3) << 8);
            const float db = d * (0.5f + (float)((b[74 + i / 4] >> (4 * ((i / 2) % 2))) & 0xF)) * 0.25f;
            const uint8_t sg = b[34 + i];
            for (int k = 0; k < 8; k++)
                y[8 * i + k] = db * (float)grid_iq2s[id][k] * ((sg >> k) & 1 ? -1.0f : 1.0f);
        }
        break;
    }
    case T_IQ3_XXS: { /* d, qs[64] (4-value grid ids), per 32: u32 (4 x 7-bit sign ids, 4-bit scale) */
        const float d = rdh(b);
        for (int g = 0; g < 8; g++) {
            const uint32_t sc = rd32(b + 66 + 4 * g);
            const float db = d * (0.5f + (float)(sc >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                const uint8_t sg = ksigns_iq2xs[(sc >> (7 * l)) & 127];
                for (int k = 0; k < 8; k++) {
                    const int e = 32 * g + 8 * l + k;
                    y[e] = db * (float)grid_iq3xxs[b[2 + e / 4]][e % 4] * ((sg >> k) & 1 ? -1.0f : 1.0f);
                }
            }
        }
        break;
    }
    case T_IQ3_S: { /* d, qs[64], qh[8] (9th id bit), signs[32], scales[4] (4 bits per 32: 1 + 2s) */
        const float d = rdh(b);
        for (int e = 0; e < QK_K; e++) {
            const int g = e / 32, i = e / 4;
            const float db = d * (float)(1 + 2 * ((b[106 + g / 2] >> (4 * (g % 2))) & 0xF));
            const int id = b[2 + i] | (((b[66 + i / 8] >> (i % 8)) & 1) << 8);
            y[e] = db * (float)grid_iq3s[id][e % 4] * ((b[74 + e / 8] >> (e % 8)) & 1 ? -1.0f : 1.0f);
        }
        break;
    }
    case T_IQ1_S: { /* d, qs[32] (id low bits), qh u16[8] (3 high bits x 4, 3-bit scale, delta sign) */
        const float d = rdh(b);
        for (int g = 0; g < 8; g++) {
            const uint16_t h = rd16(b + 34 + 2 * g);
            const float dl = d * (float)(2 * ((h >> 12) & 7) + 1), delta = (h & 0x8000) ? -0.125f : 0.125f;
            for (int l = 0; l < 4; l++) {
                const int8_t *gr = grid_iq1s[b[2 + 4 * g + l] | (((h >> (3 * l)) & 7) << 8)];
                for (int k = 0; k < 8; k++) y[32 * g + 8 * l + k] = dl * ((float)gr[k] + delta);
            }
        }
        break;
    }
    case T_IQ1_M: { /* qs[32], qh[16] (3 high id bits + delta sign per id), scales u16[4] (the fp16 d in nibbles) */
        const uint16_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
        const uint16_t sc[4] = {s0, s1, s2, s3};
        const float d = f16_to_f32((uint16_t)(((s0 & 0xF000) >> 12) | ((s1 & 0xF000) >> 8) | ((s2 & 0xF000) >> 4) |
                                              (s3 & 0xF000)));
        for (int i = 0; i < 32; i++) {
            const int j = i / 2, h = (b[32 + i / 2] >> (4 * (i % 2))) & 0xF;
            const float dl = d * (float)(2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1);
            const float delta = (h & 8) ? -0.125f : 0.125f;
            const int8_t *gr = grid_iq1s[b[i] | ((h & 7) << 8)];
            for (int k = 0; k < 8; k++) y[8 * i + k] = dl * ((float)gr[k] + delta);
        }
        break;
    }
    case T_TQ1_0: { /* qs[48] (5 base-3 digits per byte), qh[4] (4 digits per byte), d */
        static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
        const float d = rdh(b + 52);
        for (int e = 0; e < QK_K; e++) {
            uint8_t v;
            if (e < 160) v = (uint8_t)(b[e % 32] * pow3[e / 32]);
            else if (e < 240) v = (uint8_t)(b[32 + (e - 160) % 16] * pow3[(e - 160) / 16]);
            else v = (uint8_t)(b[48 + (e - 240) % 4] * pow3[(e - 240) / 4]);
            y[e] = d * (float)((int)(((uint16_t)v * 3) >> 8) - 1);
        }
        break;
    }
    case T_TQ2_0: { /* qs[64] (2-bit, 4 planes of 32 per 128), d */
        const float d = rdh(b + 64);
        for (int e = 0; e < QK_K; e++)
            y[e] = d * (float)((int)((b[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3) - 1);
        break;
    }
    case T_MXFP4: { /* e8m0 exponent, qs[16] nibbles into the doubled e2m1 table; d = 2^(e-128) */
        const uint32_t e = b[0], bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
        float d;
        memcpy(&d, &bits, 4);
        for (int l = 0; l < 32; l++) y[l] = d * (float)kvalues_fp4[(b[1 + l % 16] >> (4 * (l / 16))) & 0xF];
        break;
    }
    case T_NVFP4: { /* 4 ue4m3 scales (one per 16), qs[32]: per 16, 8 bytes, low nibbles first */
        for (int s = 0; s < 4; s++) {
            const uint8_t x = b[s];
            const int ex = (x >> 3) & 0xF;
            const float man = (float)(x & 7);
            const float raw = ex == 0 ? man * 0x1p-9f : (1.0f + man / 8.0f) * pow2i(ex - 7);
            const float d = (x == 0 || x == 0x7F) ? 0.0f : raw * 0.5f;
            for (int l = 0; l < 16; l++)
                y[16 * s + l] = d * (float)kvalues_fp4[(b[4 + 8 * s + l % 8] >> (4 * (l / 8))) & 0xF];
        }
        break;
    }
    }
}

static void dequant_row(int type, const uint8_t *src, int64_t n, float *y) {
#ifdef STRATA_AVX2
    if (fused_dequant_row(type, src, n, y)) return;
#endif
    switch (type) {
    case T_F32: memcpy(y, src, (size_t)n * 4); return;
    case T_F16:
        for (int64_t i = 0; i < n; i++) y[i] = f16_to_f32(rd16(src + 2 * i));
        return;
    case T_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)rd16(src + 2 * i) << 16;
            memcpy(y + i, &bits, 4);
        }
        return;
    default: {
        int elems, bytes;
        block_of(type, &elems, &bytes);
        for (int64_t i = 0; i < n / elems; i++) dequant_block(type, src + i * bytes, y + i * elems);
    }
    }
}

#endif  /* STRATA_EXPERT_POOL_DECODE_H */
