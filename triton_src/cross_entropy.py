"""Cross entropy over a large vocabulary, its gradient computed in the forward pass (or,
deferred, in the backward pass from the logits and each row's lse).

Per row i with target y (V classes, logits x; softcap c: x -> c * tanh(x / c) first):

  lse   = log(sum_j exp(x_j))
  ce    = (1 - ls) * w_y * (lse - x_y) + (ls / V) * sum_j w_j * (lse - x_j)   (torch's
          label smoothing with class weights w; w = 1 without weights)
  z     = s * lse^2                                                           (z-loss)
  loss  = ce / D_w + z / D_n  for reduction "mean", else ce + z

D_w = sum of w_y over non-ignored rows (torch's weighted mean), D_n = their count; they
live on the device (cross_entropy_den_kernel), so nothing waits for the host. D_n is exact
(integer counts in fp32, below 2^24 rows); D_w is a sum of per-program partial sums added
atomically, so with class weights its last bit may differ from run to run. The gradient
of that row's loss, written in the logits' dtype:

  g_j = p_j * A - (ls / V) * w_j / D_w - [j == y] * (1 - ls) * w_y / D_w,  p = softmax(x)
  A   = ((1 - ls) * w_y + (ls / V) * sum_j w_j) / D_w + 2 * s * lse / D_n
  (times 1 - tanh^2(x_j / c) with a softcap; D_w = D_n = 1 unless "mean")

The EXTRA variants (one program per row; general ones where weights, smoothing or a softcap
need it, else plain ones) also write each row's argmax over
the (softcapped) logits, its first maximum as torch.argmax, tracked in pass 1's online
max (IGNORED_PREDICTION for an ignored row), and with token_scaling != 0 multiply the row's
loss, z-loss and gradient by p_y = softmax(x)_y (taken as a constant: Liger Kernel's token
scaling).

Ignored rows get loss 0 (0 / D, so NaN when every row is ignored, like torch) and a zero
gradient row; a target outside [0, V) that is not ignore_index gives NaN (loss and
gradient of that row, and D, so a "mean" is NaN): there is no host check to raise.

Kernels:
  cross_entropy_fwd_kernel   R = min(M, PER_SM x SMs) rows at once: CHUNKS programs per row,
                             the programs pid // CHUNKS walking rows pid // CHUNKS, + R, ...
                             Program c of a row covers its chunk c (cdiv(cdiv(V, BLOCK),
                             CHUNKS) blocks; CHUNKS 1: the whole row). Pass 1 reads the
                             chunk once (online max / sum of exp); with CHUNKS > 1 the row's
                             programs, launched as one thread-block cluster, exchange
                             their chunks' sums through distributed shared memory at one
                             hardware cluster barrier and each combines them in the same
                             order; pass 2 re-reads the chunk last block first (its
                             tail still in L2) and writes the gradient. The gradient may be
                             the logits' own memory: every element is read before the same
                             thread overwrites it, and x_y is read before the meeting.
                             With write_lse != 0 it also writes each row's lse (0 for an
                             ignored row) for the deferred backward.
  cross_entropy_den_kernel   D_w and D_n: programs over blocks of targets, each adding its
                             partial sums to the zeroed den atomically.
  cross_entropy_scale_kernel dst = src * grad_output (a scalar, or one value per row); in
                             place it returns at once where grad_output is 1.
  cross_entropy_bwd_kernel   the deferred gradient: g_j above times grad_output from the raw
                             logits, the saved lse and den, over tiles of BLOCK columns
                             (persistent; a tile needs nothing from another): one read of
                             the logits and one write of the gradient, which may be the
                             logits' own memory. For a scaled loss: the forward without the
                             gradient (one read) + this = three passes over the logits,
                             against four for the forward with the gradient + the scale.
All math is in fp32; offsets are int64.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args
from _common import cluster_arrive as _cluster_arrive

# Variant flag: class weights, label smoothing or softcap (run-time switches inside); the
# plain variant has none of them and keeps pass 2 to an FMA, an exp and a multiply per element.
FLAG_GENERAL = 2

# Variant flag (alone or with FLAG_GENERAL): the argmax of each row into pred_ptr and the
# run-time switch token_scaling; one program per row.
FLAG_EXTRA = 4

REDUCTION_NONE, REDUCTION_MEAN, REDUCTION_SUM = 0, 1, 2

# The predicted token written for an ignored row.
IGNORED_PREDICTION = tl.constexpr(-100)

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _tanh(u):
    """tanh through exp2: exact at +-inf, absolute error about 1e-7 near 0."""
    return 1.0 - 2.0 / (tl.exp2(u * (2.0 * LOG2E)) + 1.0)


@triton.constexpr_function
def _exchange_asm(chunks, values):
    """PTX for _cluster_exchange. Operands: outputs $0 .. $(n - 1), n = values x chunks;
    inputs: the values, the slot's byte offset, first."""
    n = values * chunks
    lines = ["{", f".shared .align 16 .f32 fk_ce_sums[{2 * n}];",
             ".reg .b32 %fk_a, %fk_r, %fk_o;", ".reg .pred %fk_p;",
             f"setp.ne.u32 %fk_p, ${n + values + 1}, 0;",
             "@%fk_p barrier.cluster.wait.acquire;",
             "mov.u32 %fk_a, fk_ce_sums;", f"add.u32 %fk_a, %fk_a, ${n + values};",
             "mov.u32 %fk_o, %cluster_ctarank;", "shl.b32 %fk_o, %fk_o, 2;",
             "mov.u32 %fk_r, %tid.x;", "setp.eq.u32 %fk_p, %fk_r, 0;"]
    for j in range(chunks):
        lines += [f"mapa.shared::cluster.u32 %fk_r, %fk_a, {j};", "add.u32 %fk_r, %fk_r, %fk_o;"]
        lines += [f"@%fk_p st.shared::cluster.f32 [%fk_r+{4 * v * chunks}], ${n + v};"
                  for v in range(values)]
    lines += ["barrier.cluster.arrive.release;", "barrier.cluster.wait.acquire;"]
    lines += [f"ld.shared.f32 ${k}, [%fk_a+{4 * k}];" for k in range(n)]
    return "\n".join(lines + ["}"])


@triton.constexpr_function
def _exchange_constraints(chunks, values):
    return ",".join(["=f"] * (values * chunks) + ["f"] * values + ["r", "r"])


@triton.constexpr_function
def _exchange_dtypes(chunks, values):
    return (tl.float32, ) * (values * chunks)


@triton.jit
def _cluster_exchange(row, rank, m, d, sx, sw, slot, first, CHUNKS: tl.constexpr,
                      GENERAL: tl.constexpr):
    """The sums (m, d, and with GENERAL sx, sw) of every program of this program's
    thread-block cluster of CHUNKS, flat: value v of the program of cluster rank j (= pid %
    CHUNKS) at v * CHUNKS + j. row and rank name the exchange for emulations; the hardware
    needs neither.

    Each program's first thread stores its sums into slot `slot` (0 or 1, alternating
    from one exchange of the program to the next) of every program's shared memory
    (distributed shared memory), the cluster meets once at a hardware barrier (release /
    acquire), and each program reads the gathered sums from its own shared memory:
      - a slot is written again two exchanges later, by programs that have passed the
        meeting of the exchange in between, which every program reaches only after reading;
      - no program writes into another's shared memory after a meeting that the other
        waits for, so a program may leave right after its last exchange;
      - the first exchange (first != 0) waits until every program of the cluster has
        started (_cluster_arrive at its start) before writing into their memory."""
    VALUES: tl.constexpr = 4 if GENERAL else 2
    if GENERAL:
        args = [m, d, sx, sw]
    else:
        args = [m, d]
    off = slot * (4 * VALUES * CHUNKS)
    return tl.inline_asm_elementwise(_exchange_asm(CHUNKS, VALUES),
                                     _exchange_constraints(CHUNKS, VALUES),
                                     args + [off, first], dtype=_exchange_dtypes(CHUNKS, VALUES),
                                     is_pure=False, pack=1)


@triton.jit
def _grad_block(raw, lanes, start, y, lse2, a, c_y, c_w, softcap, inv_cap, weight_ptr,
                has_weight, has_softcap, smoothing, V, GENERAL: tl.constexpr,
                BLOCK: tl.constexpr):
    """The gradient of the block of a row starting at column `start` (lanes: 0 .. BLOCK-1)
    from its raw logits (see the module docstring); lse2 = lse * log2(e). The target's
    one-hot term is only added in the block that holds the target, comparing 32-bit lane
    numbers."""
    x = raw.to(tl.float32)
    if GENERAL:
        dcap = tl.full(x.shape, 1.0, tl.float32)
        if has_softcap != 0:
            t = _tanh(x * inv_cap)
            x = softcap * t
            dcap = 1.0 - t * t
    g = tl.exp2(x * LOG2E - lse2) * a
    if (y >= start) & (y < start + BLOCK):
        g = g - tl.where(lanes == (y - start).to(tl.int32), c_y, 0.0)
    if GENERAL:
        if smoothing:
            cols = start + lanes
            w = (cols < V).to(tl.float32)
            if has_weight != 0:
                w = tl.load(weight_ptr + cols, mask=cols < V, other=0.0)
            g = g - c_w * w
        g = g * dcap
    return g


@triton.jit
def cross_entropy_fwd_kernel(x_ptr, grad_ptr, target_ptr, weight_ptr, den_ptr, loss_ptr, z_ptr,
                             x_stride, grad_stride, M, V, ignore_index, label_smoothing,
                             lse_square_scale, softcap, has_weight, has_softcap, write_grad,
                             pred_ptr, token_scaling, lse_ptr, write_lse, BLOCK: tl.constexpr,
                             GENERAL: tl.constexpr, PER_SM: tl.constexpr,
                             CHUNKS: tl.constexpr, EXTRA: tl.constexpr):
    gdtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    PASS1_POLICY: tl.constexpr = "evict_last" if CHUNKS == 1 else ""
    if CHUNKS == 1:
        rank = 0
        first = pid
        step = nprog
        c0 = 0
        c1 = V
    else:
        # Program pid is chunk pid % CHUNKS of the row its cluster works on; a chunk is a
        # whole number of blocks (the last one shorter).
        rank = (pid % CHUNKS).to(tl.int32)
        first = pid // CHUNKS
        step = nprog // CHUNKS
        span = tl.cdiv(tl.cdiv(V, BLOCK), CHUNKS) * BLOCK
        c0 = rank * span
        c1 = tl.minimum(V, c0 + span)
    # den holds (D_w, D_n), ones unless the reduction is "mean". Loaded unconditionally: a
    # branch on the reduction left the sm_90 split variant two spill slots under its
    # 64-register cap and 2.6 % slower (benchmarks/NOTES.md v9).
    inv_dw = 1.0 / tl.load(den_ptr)
    inv_dn = 1.0 / tl.load(den_ptr + 1)
    smoothing = label_smoothing > 0.0
    inv_cap = 1.0 / softcap
    exchanges = 0  # this program's exchanges so far (CHUNKS > 1)
    # The EXTRA variants (argmax, token scaling) run one program per row.
    tl.static_assert((EXTRA == 0) | (CHUNKS == 1))
    if CHUNKS > 1:
        rank = _cluster_arrive(rank)
    for row in range(first, M, step):
        y = tl.load(target_ptr + row)
        x_row = x_ptr + row * x_stride
        g_row = grad_ptr + row * grad_stride
        if y == ignore_index:
            if write_grad != 0:
                zero = tl.zeros((BLOCK,), dtype=gdtype)
                for start in range(c0, c1, BLOCK):
                    cols = start + lanes
                    tl.store(g_row + cols, zero, mask=cols < c1, eviction_policy="evict_first")
            if rank == 0:
                tl.store(loss_ptr + row, 0.0 * inv_dw)
                tl.store(z_ptr + row, 0.0 * inv_dn)
                if write_lse != 0:
                    tl.store(lse_ptr + row, 0.0)
                if EXTRA:
                    tl.store(pred_ptr + row, IGNORED_PREDICTION)
        else:
            valid = (y >= 0) & (y < V)
            y_safe = tl.where(valid, y, 0)
            x_y = tl.load(x_row + y_safe).to(tl.float32)
            w_y = tl.full((), 1.0, tl.float32)
            if GENERAL:
                if has_softcap != 0:
                    x_y = softcap * _tanh(x_y * inv_cap)
                if has_weight != 0:
                    w_y = tl.load(weight_ptr + y_safe)
            x_y = tl.where(valid, x_y, float("nan"))
            w_y = tl.where(valid, w_y, float("nan"))

            # Pass 1: online max and sum of exp (and the sums label smoothing needs). A whole
            # row is kept in L2 for pass 2 (evict_last); a chunk is re-read soon enough
            # without the hint (with it 2 % slower: benchmarks/NOTES.md v8).
            m = -float("inf")
            d = 0.0
            sx = 0.0
            sw = 0.0
            arg = tl.full((), 0, tl.int32)  # EXTRA: the first column holding the max so far
            for start in range(c0, c1, BLOCK):
                cols = start + lanes
                mask = cols < c1
                x = tl.load(x_row + cols, mask=mask, other=-float("inf"),
                            eviction_policy=PASS1_POLICY).to(tl.float32)
                if GENERAL:
                    if has_softcap != 0:
                        x = tl.where(mask, softcap * _tanh(x * inv_cap), -float("inf"))
                if GENERAL:
                    if smoothing:
                        w = mask.to(tl.float32)
                        if has_weight != 0:
                            w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
                        sx += tl.sum(tl.where(mask, w * x, 0.0), axis=0)
                        sw += tl.sum(w, axis=0)
                block_max = tl.max(x, axis=0)
                if EXTRA:
                    # The block's first column holding its max replaces the argmax only for
                    # a strictly larger max: the first max of the row, as torch.argmax.
                    block_arg = tl.min(tl.where(x == block_max, cols, V), axis=0)
                    arg = tl.where(block_max > m, block_arg, arg)
                m_new = tl.maximum(m, block_max)
                m2 = tl.where(m_new == -float("inf"), 0.0, m_new) * LOG2E
                d = d * tl.exp2(m * LOG2E - m2) + tl.sum(tl.exp2(x * LOG2E - m2), axis=0)
                m = m_new
            if CHUNKS > 1:
                # The cluster's programs combine their chunks' sums in the same order, so
                # each gets the whole row's (bit for bit the same) lse.
                sums = _cluster_exchange(row, rank, m, d, sx, sw, exchanges % 2,
                                         (exchanges == 0).to(tl.int32), CHUNKS, GENERAL)
                exchanges += 1
                m = sums[0]
                for j in tl.static_range(1, CHUNKS):
                    m = tl.maximum(m, sums[j])
                m2 = tl.where(m == -float("inf"), 0.0, m) * LOG2E
                d = sums[CHUNKS] * tl.exp2(sums[0] * LOG2E - m2)
                for j in tl.static_range(1, CHUNKS):
                    d += sums[CHUNKS + j] * tl.exp2(sums[j] * LOG2E - m2)
                if GENERAL:
                    sx = sums[2 * CHUNKS]
                    sw = sums[3 * CHUNKS]
                    for j in tl.static_range(1, CHUNKS):
                        sx += sums[2 * CHUNKS + j]
                        sw += sums[3 * CHUNKS + j]
            lse = m + tl.log(d)

            ce = w_y * (lse - x_y)
            a = w_y * inv_dw
            c_w = tl.full((), 0.0, tl.float32)
            if GENERAL:
                if smoothing:
                    eps = label_smoothing / V
                    ce = (1.0 - label_smoothing) * ce + eps * (sw * lse - sx)
                    a = ((1.0 - label_smoothing) * w_y + eps * sw) * inv_dw
                    c_w = eps * inv_dw
            c_y = (1.0 - label_smoothing) * w_y * inv_dw
            z = lse_square_scale * lse * lse
            a = a + 2.0 * lse_square_scale * lse * inv_dn
            if EXTRA:
                if token_scaling != 0:
                    # The row's loss (and so its gradient) times p_y = softmax(x)_y, a
                    # constant of the gradient.
                    p_y = tl.exp2((x_y - lse) * LOG2E)
                    ce = ce * p_y
                    z = z * p_y
                    a = a * p_y
                    c_y = c_y * p_y
                    c_w = c_w * p_y
            if rank == 0:
                tl.store(loss_ptr + row, ce * inv_dw + z * inv_dn)
                tl.store(z_ptr + row, z * inv_dn)
                if write_lse != 0:
                    tl.store(lse_ptr + row, lse)
                if EXTRA:
                    tl.store(pred_ptr + row, arg.to(tl.int64))

            # Pass 2: re-read the row and write the gradient, last block first (the
            # blocks pass 1 read last are the likeliest still in L2); each thread reads its
            # elements before it overwrites them, so grad may be the logits' memory.
            if write_grad != 0:
                lse2 = lse * LOG2E
                nblk = tl.cdiv(c1 - c0, BLOCK)
                for i in range(0, nblk):
                    start = c0 + (nblk - 1 - i) * BLOCK
                    cols = start + lanes
                    mask = cols < c1
                    raw = tl.load(x_row + cols, mask=mask, other=0.0,
                                  eviction_policy="evict_first")
                    g = _grad_block(raw, lanes, start, y, lse2, a, c_y, c_w, softcap, inv_cap,
                                    weight_ptr, has_weight, has_softcap, smoothing, V, GENERAL,
                                    BLOCK)
                    tl.store(g_row + cols, g.to(gdtype), mask=mask, eviction_policy="evict_first")


@triton.jit
def cross_entropy_den_kernel(target_ptr, weight_ptr, den_ptr, N, V, ignore_index, has_weight,
                             BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    """Adds to den[0] the sum of w_y over non-ignored rows (their count without weights) and
    to den[1] their count, over the blocks of BLOCK rows pid, pid + P, ... (P programs, each
    adding its partial sums atomically: den must be zeros before the launch). A non-ignored
    target outside [0, V) makes both NaN."""
    lanes = tl.arange(0, BLOCK)
    acc_w = tl.zeros((BLOCK,), tl.float32)
    acc_n = tl.zeros((BLOCK,), tl.float32)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK, N, step):
        rows = start + lanes
        in_range = rows < N
        y = tl.load(target_ptr + rows, mask=in_range, other=ignore_index)
        keep = in_range & (y != ignore_index)
        valid = (y >= 0) & (y < V)
        w = tl.full((BLOCK,), 1.0, tl.float32)
        if has_weight != 0:
            w = tl.load(weight_ptr + tl.where(valid, y, 0), mask=keep & valid, other=0.0)
        acc_w += tl.where(keep, tl.where(valid, w, float("nan")), 0.0)
        acc_n += tl.where(keep, tl.where(valid, 1.0, float("nan")), 0.0)
    tl.atomic_add(den_ptr, tl.sum(acc_w, axis=0), sem="relaxed")
    tl.atomic_add(den_ptr + 1, tl.sum(acc_n, axis=0), sem="relaxed")


@triton.jit
def cross_entropy_scale_kernel(src_ptr, dst_ptr, g_ptr, g_stride, src_stride, dst_stride, M, V,
                               in_place, BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    """dst[i, :] = src[i, :] * g[i * g_stride] over tiles of BLOCK columns, persistent. In
    place (dst == src) a scalar g of 1 returns at once and rows with g == 1 are skipped."""
    dtype = dst_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    tiles_per_row = tl.cdiv(V, BLOCK)
    g0 = tl.load(g_ptr)
    if (in_place == 0) | (g_stride != 0) | (g0 != 1.0):
        for t in range(pid, M * tiles_per_row, nprog):
            row = t // tiles_per_row
            cols = (t - row * tiles_per_row) * BLOCK + lanes
            g = tl.load(g_ptr + row * g_stride)
            if (in_place == 0) | (g != 1.0):
                mask = cols < V
                x = tl.load(src_ptr + row * src_stride + cols, mask=mask, other=0.0,
                            eviction_policy="evict_first")
                tl.store(dst_ptr + row * dst_stride + cols, (x.to(tl.float32) * g).to(dtype),
                         mask=mask, eviction_policy="evict_first")



@triton.jit
def cross_entropy_bwd_kernel(x_ptr, grad_ptr, target_ptr, weight_ptr, den_ptr, lse_ptr, g_ptr,
                             wsum_ptr, g_stride, x_stride, grad_stride, M, V, ignore_index,
                             label_smoothing, lse_square_scale, softcap, has_weight,
                             has_softcap, BLOCK: tl.constexpr, GENERAL: tl.constexpr,
                             PER_SM: tl.constexpr):
    """The deferred gradient: grad[i, :] = g[i * g_stride] * d loss_i / d x[i, :] from the
    raw logits, each row's lse (the forward's, written with write_lse) and den, in one read
    of the logits and one write of the gradient, over tiles of BLOCK columns (persistent:
    tiles pid, pid + P, ...); the lse is known, so a tile needs no other tile. grad may be
    the logits' own memory (each element is read before the same thread overwrites it).
    wsum_ptr: the sum of the class weights (read with weights and label smoothing)."""
    gdtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    tiles_per_row = tl.cdiv(V, BLOCK)
    inv_dw = 1.0 / tl.load(den_ptr)
    inv_dn = 1.0 / tl.load(den_ptr + 1)
    smoothing = label_smoothing > 0.0
    inv_cap = 1.0 / softcap
    for tile in range(pid, M * tiles_per_row, nprog):
        row = tile // tiles_per_row
        start = (tile - row * tiles_per_row) * BLOCK
        cols = start + lanes
        mask = cols < V
        y = tl.load(target_ptr + row)
        g_row = grad_ptr + row * grad_stride
        if y == ignore_index:
            tl.store(g_row + cols, tl.zeros((BLOCK,), dtype=gdtype), mask=mask,
                     eviction_policy="evict_first")
        else:
            go = tl.load(g_ptr + row * g_stride)
            lse = tl.load(lse_ptr + row)
            valid = (y >= 0) & (y < V)
            w_y = tl.full((), 1.0, tl.float32)
            if GENERAL:
                if has_weight != 0:
                    w_y = tl.load(weight_ptr + tl.where(valid, y, 0))
            w_y = tl.where(valid, w_y, float("nan"))
            # The forward's scalars of the row (see the module docstring), times grad_output.
            a = w_y * inv_dw
            c_w = tl.full((), 0.0, tl.float32)
            if GENERAL:
                if smoothing:
                    eps = label_smoothing / V
                    sw = V * 1.0
                    if has_weight != 0:
                        sw = tl.load(wsum_ptr)
                    a = ((1.0 - label_smoothing) * w_y + eps * sw) * inv_dw
                    c_w = eps * inv_dw
            c_y = (1.0 - label_smoothing) * w_y * inv_dw
            a = (a + 2.0 * lse_square_scale * lse * inv_dn) * go
            raw = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0,
                          eviction_policy="evict_first")
            g = _grad_block(raw, lanes, start, y, lse * LOG2E, a, c_y * go, c_w * go, softcap,
                            inv_cap, weight_ptr, has_weight, has_softcap, smoothing, V, GENERAL,
                            BLOCK)
            tl.store(g_row + cols, g.to(gdtype), mask=mask, eviction_policy="evict_first")

# Floor at Llama-3 shapes (8192 x 128256 bf16 logits, 2.10 GB; 4.2 TB/s copy bandwidth):
# forward with the gradient = one read of the logits + one write of the gradient, 4.2 GB,
# 1.0 ms if pass 2's re-read came from L2 (with one program per row, hundreds of 250 KB rows
# in flight and the gradient writes passing through the 50 MB L2, a third of it comes from
# DRAM; split over a cluster, a chunk's blocks are re-read microseconds later); forward without
# the gradient 0.5 ms; the backward is one launch that returns at once for grad_output 1,
# else one more read + write, 1.0 ms. The kernel is also near its instruction issue limit
# (fewer programs than SMs run proportionally slower), so the element loops are kept lean:
# one FMA per exponent, masked lanes loaded as -inf, the one-hot term only in the target's
# block with 32-bit lane numbers (benchmarks/NOTES.md v7: 23 -> 16 instructions an
# element).
#
# Launch configurations for sm_90 (H200: 132 SMs, 50 MB L2), from the sweeps of
# benchmarks/tune_cross_entropy.py and benchmarks/probes/ce_cluster.py at 8192 x 128256 bf16.
# fwd: per kind of variant and element size, (BLOCK, warps, rows per SM[, CHUNKS, maxnreg]).
#   plain: aligned, no weights / smoothing / softcap: the Llama training case. 16-bit: each
#     row over a cluster of 8 programs of 4 warps (chunks of four 8 KB blocks, at most 64
#     registers: 8 programs per SM), one row per cluster: 1.205 ms in ce_cluster.py against
#     1.318 for the one-program-per-row form below (Nsight Compute: the split form reads
#     2.25 GB from DRAM, the floor's 2.1, where one program per row reads 2.89 GB; both
#     wait on memory at half occupancy). Without the register cap (96) 1.35 ms; 4 chunks of
#     8192 x 8 warps 1.27-1.29; 16 KB blocks of 16 warps 1.84. The chunks' sums pushed
#     through distributed shared memory at one barrier: 1.168 ms in ce_exchange.py, against
#     1.180 through a global buffer and 1.20-1.21 with a second barrier (every extra wait is
#     paid in each of about 62 waves of 19 us programs). fp32, and the 16-bit form
#     before: one row per program (PER_SM 64 covers 8192 rows) in 32 KB steps of 16 warps,
#     pass 2 reversed: 1.30-1.32 ms (ce_l2.py: 32 warps 1.30, 64 KB steps 1.38; a grid of
#     one program per SM 1.35-1.67; pass 2 forward 1.63). Earlier forms: 64 KB steps of 32
#     warps, pass 2 forward, 1.46-1.48 ms; software prefetch of the next block 1.6-1.9 ms;
#     loads pipelined through shared memory (cp.async or TMA, 3-4 stages) 1.41-4.5 ms.
#   unaligned (row length not a multiple of 16, or a misaligned pointer): scalar loads hold
#     more registers; half the block.
#   general: weights, smoothing or softcap hold several values per element: 16 KB steps.
#   extra: the argmax / token scaling without those options: the one-program-per-row form
#     (tune_cross_entropy.py: 1.77 ms for the plain kernel of 32 KB steps of 16 warps, 2.66
#     for the general EXTRA one of 16 KB steps, 2.48 for the general one without EXTRA).
#   small: rows of at most SMALL classes, many programs per SM.
# scale: tiles of 4096 columns, 8 warps, 8 programs per SM: 64 KB in flight per SM.
# bwd (the deferred backward; not tuned on a GPU yet): tiles of 4096 columns, 8 warps, 8
#   programs per SM as scale for the plain aligned variant (58 registers on sm_90: 4 programs
#   resident per SM); the general and unaligned ones hold more values per element (up to
#   152 registers at 4096 columns, one program per SM): half the tile (48-80 registers).
#   Floor at the Llama-3 shape: one read + one write of the logits, 1.0 ms on an H200.
# den: blocks of 256 targets, at most 1 program per SM (8192 rows: 32 programs, one block
#   each, so one target load and one weight gather deep instead of 8 steps of each in one
#   program: 26.5 us measured for that), each adding 2 floats atomically.
SMALL = 1024  # the small bucket; every longer row takes the large one
LARGE = 1 << 17  # label of the large bucket (rows of any length)
# Other archs (not tuned): smaller blocks for the plain, unaligned and general variants,
# which keep the sm_80 / sm_100 / sm_103 / sm_120 code from spilling; the rest as sm_90.
_SM90 = {
    "small": {2: (1024, 4, 8), 4: (1024, 4, 8)},
    "plain": {2: (4096, 4, 64, 8, 64), 4: (16384, 16, 64)},
    "unaligned": {2: (16384, 16, 64), 4: (8192, 16, 64)},
    "general": {2: (8192, 16, 64), 4: (4096, 16, 64)},
    "extra": {2: (16384, 16, 64), 4: (16384, 16, 64)},
    "scale": (4096, 8, 8),
    "bwd": {"plain": (4096, 8, 8), "other": (2048, 8, 8)},
    "den": (256, 4, 1),
}
_CONFIG = {
    90: _SM90,
    "default": dict(_SM90, plain={2: (16384, 16, 64), 4: (8192, 16, 64)},
                    unaligned={2: (8192, 16, 64), 4: (4096, 16, 64)},
                    extra={2: (16384, 16, 64), 4: (8192, 16, 64)},
                    general={2: (4096, 16, 64), 4: (4096, 16, 64)}),
}
_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}

_FWD_ARGS = ("x_ptr", "grad_ptr", "target_ptr", "weight_ptr", "den_ptr", "loss_ptr", "z_ptr",
             "x_stride", "grad_stride", "M", "V", "ignore_index", "label_smoothing",
             "lse_square_scale", "softcap", "has_weight", "has_softcap", "write_grad",
             "pred_ptr", "token_scaling", "lse_ptr", "write_lse")
_BWD_ARGS = ("x_ptr", "grad_ptr", "target_ptr", "weight_ptr", "den_ptr", "lse_ptr", "g_ptr",
             "wsum_ptr", "g_stride", "x_stride", "grad_stride", "M", "V", "ignore_index",
             "label_smoothing", "lse_square_scale", "softcap", "has_weight", "has_softcap")
_SCALE_ARGS = ("src_ptr", "dst_ptr", "g_ptr", "g_stride", "src_stride", "dst_stride", "M", "V",
               "in_place")
_DEN_ARGS = ("target_ptr", "weight_ptr", "den_ptr", "N", "V", "ignore_index", "has_weight")
_TYPES = {"target_ptr": "*i64", "weight_ptr": "*fp32", "den_ptr": "*fp32", "loss_ptr": "*fp32",
          "z_ptr": "*fp32", "g_ptr": "*fp32", "x_stride": "i64",
          "grad_stride": "i64", "src_stride": "i64", "dst_stride": "i64", "g_stride": "i64",
          "M": "i64", "N": "i64",
          "V": "i32", "ignore_index": "i64", "label_smoothing": "fp32",
          "lse_square_scale": "fp32", "softcap": "fp32", "has_weight": "i32",
          "has_softcap": "i32", "write_grad": "i32", "in_place": "i32", "pred_ptr": "*i64",
          "token_scaling": "i32", "lse_ptr": "*fp32", "wsum_ptr": "*fp32", "write_lse": "i32"}
# Integer arguments that are multiples of 16 in an aligned variant (row lengths, strides).
_ALIGNED_INTS = ("x_stride", "grad_stride", "src_stride", "dst_stride", "V")


def _signature(args, dt, constexprs):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    cfg = _CONFIG.get(arch, _CONFIG["default"])
    out = []
    for dt in DTYPES:
        for aligned in (0, FLAG_ALIGNED):
            def add(family, kernel, args, block, constexprs, warps, flags, cluster=1,
                    maxnreg=0):
                sig = _signature(args, dt, constexprs)
                extra = tuple(a for a in _ALIGNED_INTS if a in sig)
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                   signature=sig, constexprs=constexprs, num_warps=warps,
                                   flags=flags, divisible_by_16=aligned_args(sig, flags, extra),
                                   cluster=cluster, maxnreg=maxnreg))

            for general in (0, FLAG_GENERAL, FLAG_GENERAL | FLAG_EXTRA, FLAG_EXTRA):
                kind = ("general" if general & FLAG_GENERAL else
                        "unaligned" if not aligned else "extra" if general else "plain")
                for bucket, table in ((SMALL, cfg["small"]), (LARGE, cfg[kind])):
                    block, warps, per_sm, chunks, maxnreg = (table[_ELEM[dt]] + (1, 0))[:5]
                    add("cross_entropy_fwd", "cross_entropy_fwd_kernel", _FWD_ARGS, bucket,
                        {"BLOCK": block, "GENERAL": int((general & FLAG_GENERAL) != 0),
                         "PER_SM": per_sm,
                         "CHUNKS": chunks, "EXTRA": int((general & FLAG_EXTRA) != 0)},
                        warps, aligned | general, chunks, maxnreg)
            block, warps, per_sm = cfg["scale"]
            add("cross_entropy_scale", "cross_entropy_scale_kernel", _SCALE_ARGS, block,
                {"BLOCK": block, "PER_SM": per_sm}, warps, aligned)
            for general in (0, FLAG_GENERAL):
                kind = "plain" if aligned and not general else "other"
                block, warps, per_sm = cfg["bwd"][kind]
                add("cross_entropy_bwd", "cross_entropy_bwd_kernel", _BWD_ARGS, block,
                    {"BLOCK": block, "GENERAL": int(general != 0), "PER_SM": per_sm}, warps,
                    aligned | general)
    block, warps, per_sm = cfg["den"]
    out.append(Variant(family="cross_entropy_den", kernel="cross_entropy_den_kernel",
                       dtype="fp32", block=block,
                       signature=_signature(_DEN_ARGS, "fp32", ("BLOCK", "PER_SM")),
                       constexprs={"BLOCK": block, "PER_SM": per_sm}, num_warps=warps))
    return out
