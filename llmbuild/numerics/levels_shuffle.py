"""The 4-bit one-row product with AVX2's byte shuffle as its 16-entry table: levels_product's bits, 2.5x faster.

levels_product.py dequantizes each 4-bit level by arithmetic (widen, subtract the zero, scale, round to
bf16: some ten vector operations per eight weights), and on a CPU without AVX-512 that, not reading the
levels, is what a 4-bit decode step waits on (a 1.5B w4 model's 8960 x 1536 projection at 7 GFLOP/s on
one core). A group's 16 levels have 16 values, so here they are computed once per group and looked up:

- the table: the group's 16 values computed as levels_product computes a weight (float32(level) minus the
  zero, times the scale, rounded to nearest even in bf16, NaN made the canonical NaN), packed into two
  16-byte tables, the low and the high byte of each bf16 value, both copied into each 128-bit half;
- a block of 64 levels (32 bytes) is split into its low and high nibbles, and `vpshufb` looks each of the
  64 up in both byte tables (four shuffles); interleaving the two bytes makes bf16 values, and a shift or a
  mask of each 32-bit word makes them float32.

The unpacking leaves the 64 weights of a block in an order of its own (`LANE_ORDER`: position p holds
k = LANE_ORDER[p] of the block), the same in every block. Lane p's sum is then the sum of that k's products
in k order, as vector_product defines it, only held in another register position. So the function
permutes x into that order once per call (on its stack), multiplies and adds lane by lane (the product
rounded, then the sum: no FMA), and puts the 64 sums back in k order before vector_product's lane tree.
The result has the bits of levels_product's arithmetic form (tests/test_levels_product.py).

bf16-rounded dequantization (`dequant_dtype` bf16) only: a float32 table would need four byte tables.
x86-64 with AVX2; levels_product compiles it only there.
"""

from __future__ import annotations

from llmbuild.numerics.llvm_kernels import prefetch, splat
from llmbuild.numerics.vector_product import LANES, lane_multiply_adds, row_end

_ACCUMULATORS = 4  # <16 x float> each, as vector_product's kernels hold a block's 64 lanes


def _unpack_bytes(low_half: bool) -> list[int]:
    """The mask of `vpunpck{l,h}bw` on two <32 x i8> (a = 0..31, b = 32..63): within each 128-bit half,
    bytes 0-7 (low) or 8-15 (high) of a and b interleaved."""
    first = 0 if low_half else 8
    return [i for half in (0, 16) for j in range(8) for i in (half + first + j, 32 + half + first + j)]


def _lane_order() -> list[int]:
    """Position p of the block's four <16 x float> weight vectors -> the k (0-63) of the block it holds.
    Byte i of the block holds k = 2i (low nibble) and 2i + 1 (high nibble); each nibble set is looked up,
    the two bytes of bf16 interleaved (`_unpack_bytes`), and each 32-bit word of two bf16 gives its even
    (shifted) then its odd (masked) one."""
    order = []
    for nibble in (0, 1):
        for low_half in (True, False):
            words = _unpack_bytes(low_half)[0::2]  # the byte i each 16-bit word's value came from
            order += [2 * i + nibble for i in words[0::2]] + [2 * i + nibble for i in words[1::2]]
    return order


LANE_ORDER = _lane_order()
assert sorted(LANE_ORDER) == list(range(LANES))

# After `vpackusdw` of the two 8-value halves A and B and the byte split below, table byte j holds
# A[0:4], B[0:4], A[4:8], B[4:8]: so A computes the levels 0-3, 8-11 and B 4-7, 12-15, and byte j is level j.
_HALF_LEVELS = {"A": [0, 1, 2, 3, 8, 9, 10, 11], "B": [4, 5, 6, 7, 12, 13, 14, 15]}


def _table_half(tag: str) -> list[str]:
    """IR of one half's eight bf16 values as i32 words (the value's top 16 bits): levels_product's
    arithmetic and rounding (the canonical NaN 0x7fc0 for a NaN)."""
    levels = "<" + ", ".join(f"float {v}.0" for v in _HALF_LEVELS[tag]) + ">"
    i32 = lambda v: splat(8, "i32", v)  # noqa: E731
    return [f"  %td{tag} = fsub <8 x float> {levels}, %zs",
            f"  %tv{tag} = fmul <8 x float> %td{tag}, %ss",
            f"  %tb{tag} = bitcast <8 x float> %tv{tag} to <8 x i32>",
            f"  %to{tag}0 = lshr <8 x i32> %tb{tag}, {i32('16')}",
            f"  %to{tag} = and <8 x i32> %to{tag}0, {i32('1')}",
            f"  %tu{tag}0 = add <8 x i32> %tb{tag}, {i32('32767')}",
            f"  %tu{tag} = add <8 x i32> %tu{tag}0, %to{tag}",
            f"  %tr{tag} = lshr <8 x i32> %tu{tag}, {i32('16')}",
            f"  %tn{tag} = fcmp uno <8 x float> %tv{tag}, %tv{tag}",
            f"  %tw{tag} = select <8 x i1> %tn{tag}, <8 x i32> {i32('32704')}, <8 x i32> %tr{tag}"]


def _table() -> list[str]:
    """IR of group %gi's byte tables %tl and %th (<32 x i8>, the 16 entries in both halves)."""
    split = ", ".join(f"i32 {half + j}" for half in (0, 16) for j in [*range(0, 16, 2), *range(1, 16, 2)])
    lines = ["  %sp = getelementptr float, ptr %srow, i64 %gi", "  %s = load float, ptr %sp, align 4",
             "  %zp = getelementptr float, ptr %zrow, i64 %gi", "  %z = load float, ptr %zp, align 4",
             "  %s1 = insertelement <8 x float> poison, float %s, i64 0",
             "  %ss = shufflevector <8 x float> %s1, <8 x float> poison, <8 x i32> zeroinitializer",
             "  %z1 = insertelement <8 x float> poison, float %z, i64 0",
             "  %zs = shufflevector <8 x float> %z1, <8 x float> poison, <8 x i32> zeroinitializer",
             *_table_half("A"), *_table_half("B"),
             # 16 x u16 (A0-3 B0-3 | A4-7 B4-7), then each half's low bytes before its high bytes
             "  %tp = call <16 x i16> @llvm.x86.avx2.packusdw(<8 x i32> %twA, <8 x i32> %twB)",
             "  %tpb = bitcast <16 x i16> %tp to <32 x i8>",
             f"  %tps = shufflevector <32 x i8> %tpb, <32 x i8> poison, <32 x i32> <{split}>",
             "  %tpq = bitcast <32 x i8> %tps to <4 x i64>",
             "  %tlq = shufflevector <4 x i64> %tpq, <4 x i64> poison, <4 x i32> <i32 0, i32 2, i32 0, i32 2>",
             "  %thq = shufflevector <4 x i64> %tpq, <4 x i64> poison, <4 x i32> <i32 1, i32 3, i32 1, i32 3>",
             "  %tl = bitcast <4 x i64> %tlq to <32 x i8>",
             "  %th = bitcast <4 x i64> %thq to <32 x i8>"]
    return lines


def _block(ahead: int) -> list[str]:
    """IR of the block at %k: its 64 weights as %w0..%w3 (<16 x float>) in LANE_ORDER; the levels `ahead`
    bytes further asked for (none at 0)."""
    lines = ["  %kh = lshr i64 %k, 1", "  %lp = getelementptr i8, ptr %lrow, i64 %kh",
             *prefetch("%lp", ahead, "%pfp"),
             "  %lb = load <32 x i8>, ptr %lp, align 1",
             f"  %nib0 = and <32 x i8> %lb, {splat(32, 'i8', '15')}",
             f"  %nib1 = lshr <32 x i8> %lb, {splat(32, 'i8', '4')}"]
    vectors = []
    for nibble in (0, 1):
        lines += [f"  %lo{nibble} = call <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8> %tl, <32 x i8> %nib{nibble})",
                  f"  %hi{nibble} = call <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8> %th, <32 x i8> %nib{nibble})"]
        for half, low_half in (("a", True), ("b", False)):
            v = f"{nibble}{half}"
            mask = ", ".join(f"i32 {i}" for i in _unpack_bytes(low_half))
            lines += [f"  %bf{v} = shufflevector <32 x i8> %lo{nibble}, <32 x i8> %hi{nibble}, <32 x i32> <{mask}>",
                      f"  %wd{v} = bitcast <32 x i8> %bf{v} to <8 x i32>",
                      f"  %we{v} = shl <8 x i32> %wd{v}, {splat(8, 'i32', '16')}",
                      f"  %wo{v} = and <8 x i32> %wd{v}, {splat(8, 'i32', '-65536')}",
                      f"  %fe{v} = bitcast <8 x i32> %we{v} to <8 x float>",
                      f"  %fo{v} = bitcast <8 x i32> %wo{v} to <8 x float>"]
            vectors += [f"%fe{v}", f"%fo{v}"]
    both = "<16 x i32> <" + ", ".join(f"i32 {i}" for i in range(16)) + ">"
    for a in range(_ACCUMULATORS):
        lines.append(f"  %w{a} = shufflevector <8 x float> {vectors[2 * a]}, <8 x float> {vectors[2 * a + 1]}, {both}")
    return lines


def _in_k_order() -> list[str]:
    """IR putting the row's four accumulators %na0..%na3 (positions in LANE_ORDER) back in k order as
    %ka0..%ka3."""
    position = {k: p for p, k in enumerate(LANE_ORDER)}
    first32 = "<32 x i32> <" + ", ".join(f"i32 {i}" for i in range(32)) + ">"
    all64 = "<64 x i32> <" + ", ".join(f"i32 {i}" for i in range(64)) + ">"
    lines = [f"  %c01 = shufflevector <16 x float> %na0, <16 x float> %na1, {first32}",
             f"  %c23 = shufflevector <16 x float> %na2, <16 x float> %na3, {first32}",
             f"  %call = shufflevector <32 x float> %c01, <32 x float> %c23, {all64}"]
    for a in range(_ACCUMULATORS):
        mask = ", ".join(f"i32 {position[16 * a + j]}" for j in range(16))
        lines.append(f"  %ka{a} = shufflevector <64 x float> %call, <64 x float> poison, <16 x i32> <{mask}>")
    return lines


def ir(name: str, ahead: int) -> str:
    """LLVM IR of `name(x*, levels*, level_row_bytes, scale*, zero*, groups_per_row, group, y*, n_lo, n_hi,
    K)`, levels_product's prototype, for 4-bit levels rounded to bf16; the group a multiple of 64 dividing K;
    the levels `ahead` bytes past each block asked for (levels_product.PREFETCH_BYTES)."""
    order = ", ".join(f"i32 {k}" for k in LANE_ORDER)
    lanes = range(_ACCUMULATORS)
    row_phis = "\n".join(f"  %ga{a} = phi <16 x float> [ zeroinitializer, %row ], [ %na{a}, %gend ]" for a in lanes)
    block_phis = "\n".join(f"  %a{a} = phi <16 x float> [ %ga{a}, %group ], [ %na{a}, %kloop ]" for a in lanes)
    adds = lane_multiply_adds("%xp", "%k", [f"%w{a}" for a in lanes], [f"%a{a}" for a in lanes],
                              [f"%na{a}" for a in lanes], "")
    return f"""
define void @{name}(ptr noalias nocapture readonly %x, ptr noalias nocapture readonly %l, i64 %lstride,
    ptr noalias nocapture readonly %sc, ptr noalias nocapture readonly %ze, i64 %groups, i64 %group_size,
    ptr noalias nocapture %y, i64 %lo, i64 %hi, i64 %K) {{
entry:
  %xp = alloca float, i64 %K, align 64
  %none = icmp sge i64 %lo, %hi
  br i1 %none, label %done, label %xorder
xorder:
  %xk = phi i64 [ 0, %entry ], [ %xk1, %xorder ]
  %xsrc = getelementptr float, ptr %x, i64 %xk
  %xv = load <64 x float>, ptr %xsrc, align 4
  %xw = shufflevector <64 x float> %xv, <64 x float> poison, <64 x i32> <{order}>
  %xdst = getelementptr float, ptr %xp, i64 %xk
  store <64 x float> %xw, ptr %xdst, align 64
  %xk1 = add i64 %xk, {LANES}
  %xmore = icmp slt i64 %xk1, %K
  br i1 %xmore, label %xorder, label %row
row:
  %n = phi i64 [ %lo, %xorder ], [ %n1, %rowend ]
  %loff = mul i64 %n, %lstride
  %lrow = getelementptr i8, ptr %l, i64 %loff
  %goff = mul i64 %n, %groups
  %srow = getelementptr float, ptr %sc, i64 %goff
  %zrow = getelementptr float, ptr %ze, i64 %goff
  br label %group
group:
  %gi = phi i64 [ 0, %row ], [ %gi1, %gend ]
{row_phis}
  %k0 = mul i64 %gi, %group_size
  %kend = add i64 %k0, %group_size
{chr(10).join(_table())}
  br label %kloop
kloop:
  %k = phi i64 [ %k0, %group ], [ %knext, %kloop ]
{block_phis}
{chr(10).join(_block(ahead))}
{chr(10).join(adds)}
  %knext = add i64 %k, {LANES}
  %more = icmp slt i64 %knext, %kend
  br i1 %more, label %kloop, label %gend
gend:
  %gi1 = add i64 %gi, 1
  %gmore = icmp slt i64 %kend, %K
  br i1 %gmore, label %group, label %rowend
rowend:
{chr(10).join(_in_k_order())}
{row_end([f'%ka{a}' for a in lanes])}
"""


DECLARATIONS = """
declare <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8>, <32 x i8>)
declare <16 x i16> @llvm.x86.avx2.packusdw(<8 x i32>, <8 x i32>)
"""
