// embed.cu: rows of an embedding table gathered by id and dequantized (strata_cli/ops/embed.py): the token
// embedding of a window and the PLE n-gram table rows.
// Legend: N gathered rows (T window rows times the rows each token gathers), hd row length.
//   rows [N] int64 table row ids; table raw rows, row_bytes apart; emb [N, hd] f32.
#include "common.cuh"

#define EMBED_BLOCK 256

// emb[e, :] = dequantized table row rows[e]; table rows are of GGML type F32, F16, BF16 or Q8_0, decoded exactly
// as strata_cli/model/quants.py (table_at, common.cuh). The table may be mapped host memory. grid N, block EMBED_BLOCK.
extern "C" __global__ void __launch_bounds__(EMBED_BLOCK)
    gather_rows(const i64* __restrict__ rows, const u8* __restrict__ table, i64 row_bytes, int type,
                float* __restrict__ emb, int hd) {
    pdl_begin();
    const u8* src = table + rows[blockIdx.x] * row_bytes;
    float* dst = emb + (i64)blockIdx.x * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = table_at(src, type, i);
}
