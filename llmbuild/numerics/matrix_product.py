"""Many-row products (a prefill's projections, a vision tower's) in the arithmetic of the one-row product.

Every output y[m, n] of x [M, K] times w [N, K] is the sum numerics/vector_product.py defines for one row:
64 lanes, lane j summing x[m, k] * w[n, k] for k = j (mod 64) in k order, each product and sum rounded to
float32, then the fixed tree over the lanes. A row of a prefill therefore has exactly the bits the same
row has in a decode step, and no tiling, thread count or CPU changes a bit: each output is one sum that
one thread computes whole. BLAS gave none of this (its blocking and its kernels' order of sums are its
own, so the executors had to cut every product into fixed tiles of single-threaded BLAS calls) and it
reads only float32, so each tile of a bf16 weight was first decoded to float32.

The kernel below reads the weight as it is stored (f32, bf16 bit patterns, f16), widening 16 lanes at a
time in registers, and keeps ROWS rows of x in flight against one row of the weight, one group of 16 lanes
at a time (a lane's sum is in k order whichever group runs first): ROWS accumulators of <16 x float>, so
each weight vector loaded serves four outputs and the accumulators fit AVX2's sixteen registers. Holding
all four groups at once (sixteen <16 x float>, 32 AVX2 registers) spilled on every block: on a 2-core AMD
EPYC without AVX-512, SmolLM2's 37-row prefill products ran at 30-35 GFLOP/s that way, 50-100 this way.
Where K is large (above SEGMENTED_ABOVE), a block of x no longer stays in the L1 cache while a weight row
passes it, and every pass reread it from L2: the segmented kernel multiplies a segment of K at a time,
keeping each output's 64 lane sums in a stack scratch between segments, so each lane still adds in k order.
LLVM IR compiled with llvmlite, as vector_product's kernel is, without fast-math flags: LLVM may neither
reassociate nor fuse the arithmetic.
`reference` computes the same bits in numpy (tests/test_matrix_product.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.numerics import llvm_kernels, team, vector_product
from llmbuild.numerics.addresses import address
from llmbuild.numerics.formats import bf16_bits_to_f32
from llmbuild.numerics.parallel import row_spans
from llmbuild.numerics.vector_product import LANES

ROWS = 4  # rows of x per block: 4 accumulators of 16 lanes (8 AVX2 registers, 4 AVX-512 ones)
CHUNK = 32  # weight rows per chunk
# K above which a block of x is multiplied a segment of SEGMENT at a time (the segmented kernel): four rows
# of a 1.5B's down projection (K 8960, 140 KiB) do not stay in a 48 KiB L1 cache while a weight row passes
# them, four rows of a segment (16 KiB) do. Each output's 64 lane sums are kept in memory between segments
# (stored and loaded exactly), so every lane still adds its products in k order: the same bits. Measured
# (benchmarks/product_kernels.py) on one 2-core Xeon (bf16 weights, two threads): 19 x 1536 x 8960
# 11.6-11.9 -> 6.0-6.5 ms, 128 rows 66 ->
# 34-37 ms, 19 x 3584 x 18944 (a 7B's down projection) 59-62 -> 35-37 ms, K 4096 9.4 -> 5.2-5.5 ms; segments
# of 512 to 1536 alike, of 2048 a little slower, of 4096 no gain; at K 2048 the whole-K kernel was quicker
# (1.55-1.62 against 1.73-1.80 ms), at 2560 the segmented (2.06-2.26 against 2.18-2.21 ms; 128 rows 11.1
# against 12.5-12.8).
SEGMENT = 1024
SEGMENTED_ABOVE = 2048
_VECTOR = 16
# Multiply-adds above which a product's weight rows are split over the worker threads: from a 37-token
# prefill's k and v products (37 x 192 x 576) up, which at 2^22 ran on one thread (SmolLM2's prefill
# products 110.6-116.9 ms against 120.3-120.9 at 2^22, on a 2-core VM).
PARALLEL_MACS = 1 << 20
_STORAGE = {np.dtype(np.float32): "f32", np.dtype(np.uint16): "bf16", np.dtype(np.float16): "f16"}


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y [M, N] = x [M, K] times w [N, K] (float32 values), row by row in vector_product's arithmetic."""
    x = np.asarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    for m in range(x.shape[0]):
        out[m] = vector_product.reference(x[m], w)
    return out


def supported(x: np.ndarray, w: np.ndarray) -> bool:
    """Whether `product` runs compiled for these operands (otherwise it runs `reference`: same bits)."""
    k = w.shape[1]
    return (k % LANES == 0 and k > 0 and x.dtype == np.float32 and w.dtype in _STORAGE
            and kernel(_STORAGE[w.dtype]) is not None)


def product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out [M, N] (float32, rows may be strided) = x [M, K] (float32) times w [N, K] as stored: float32, bf16
    bit patterns (uint16) or float16; rows of w may be strided (a slice of a larger matrix)."""
    m, k = x.shape
    n = w.shape[0]
    if m == 0 or n == 0:
        return
    x = np.ascontiguousarray(x, dtype=np.float32)
    if m == 1 and out.strides[1] == out.itemsize:  # a decode step: the one-row kernel, the same arithmetic
        vector_product.product(x[0], w, out[0])
        return
    if k % LANES and m > 1 and w.dtype in _STORAGE:
        # The arithmetic pads K with zeros to whole blocks of lanes (vector_product.reference): so can the
        # operands, and the compiled kernel then gives its bits. A SigLIP MLP's K of 4304 would otherwise
        # take the numpy reference, two orders of magnitude slower, on every row of every vision piece.
        x, w = _lane_padded(x), _lane_padded(w)
        k = x.shape[1]
    usable = (supported(x, w) and w.strides[1] == w.itemsize and out.dtype == np.float32
              and out.strides[1] == 4 and out.strides[0] % 4 == 0)
    if not usable:
        values = bf16_bits_to_f32(np.ascontiguousarray(w)) if w.dtype == np.uint16 else w
        out[...] = reference(x, np.asarray(values, dtype=np.float32))
        return
    key = (_STORAGE[w.dtype], "segmented") if k > SEGMENTED_ABOVE else _STORAGE[w.dtype]
    run = _KERNELS.get(key)  # compiled with the whole-K form, which `supported` found
    assert run is not None
    xp, wp, yp = address(x), address(w), address(out)
    ws, ys = w.strides[0], out.strides[0] // 4
    span = _KERNELS.get(("span", key))
    row_spans(n, m * n * k, PARALLEL_MACS, lambda lo, hi: run(xp, k, m, wp, ws, yp, ys, lo, hi, k),
              (span, (xp, k, m, wp, ws, yp, ys, k)))


def _lane_padded(a: np.ndarray) -> np.ndarray:
    """`a` [rows, K] with zero columns up to the next multiple of LANES (zeros of its storage: +0.0)."""
    rows, k = a.shape
    out = np.zeros((rows, -(-k // LANES) * LANES), dtype=a.dtype)
    out[:, :k] = a
    return out


# ---- the compiled kernel ---------------------------------------------------------------------------

def kernel(storage: str) -> Callable[..., None] | None:
    """The compiled product for weights stored as `storage`: `(x*, x_row_elems, M, w*, w_row_bytes, y*,
    y_row_elems, n_lo, n_hi, K)`, computing y[:, n_lo:n_hi]; None when it cannot be built."""
    return _KERNELS.get(storage)


# x, x's row stride, M, w, w's row stride in bytes, y, y's row stride, lo, hi, K
_PARAMS = ("ptr", "i64", "i64", "ptr", "i64", "ptr", "i64", "i64", "i64", "i64")


def _compile() -> dict[Any, Any]:
    storages = list(vector_product.WIDEN)
    names: dict[Any, str] = {s: f"rows_product_{s}" for s in storages}
    names |= {(s, "segmented"): f"rows_product_{s}_segmented" for s in storages}
    spans, symbols, signatures = team.with_spans(names, _PARAMS, 7)
    return llvm_kernels.compile_functions(
        "\n".join(_ir(s) for s in storages) + "\n".join(_ir(s, segmented=True) for s in storages) + spans,
        symbols, signatures,
        "the compiled matrix product", "products run on numpy, much slower, with the same results")


_KERNELS = llvm_kernels.CompiledKernels(_compile)


def _k_loop(storage: str, rows: int, label: str, entry: str, exit_label: str, xrow: str,
            wrow: str) -> tuple[str, list[list[str]]]:
    """The K loops of `rows` rows of x (at `xrow`0, `xrow`1, ...) against the weight row at `wrow`, one loop
    per group of 16 lanes (blocks `label`0..3, entered from `entry`, leaving for `exit_label`): their IR
    and the final accumulators, [row][group]. A lane's sum keeps its k order whichever group runs first;
    one group at a time keeps `rows` accumulators live instead of four times as many, which AVX2's sixteen
    registers hold (four rows of all four groups spilled to the stack on every block)."""
    lines: list[str] = []
    accs: list[list[str]] = [[] for _ in range(rows)]
    previous = entry
    for group in range(LANES // _VECTOR):
        block = f"{label}{group}"
        after = exit_label if group == LANES // _VECTOR - 1 else f"{label}{group + 1}"
        lines += [f"{block}:", f"  %{block}k = phi i64 [ {group * _VECTOR}, %{previous} ], [ %{block}kn, %{block} ]"]
        lines += [f"  %{block}a{r} = phi <16 x float> [ zeroinitializer, %{previous} ], [ %{block}n{r}, %{block} ]"
                  for r in range(rows)]
        lines += vector_product.widened_load(storage, f"%{block}w", wrow, f"%{block}k")
        for r in range(rows):
            lines += vector_product.lane_multiply_adds(f"{xrow}{r}", f"%{block}k", [f"%{block}w"], [f"%{block}a{r}"],
                                                       [f"%{block}n{r}"], f"{block}{r}")
            accs[r].append(f"%{block}n{r}")
        lines += [f"  %{block}kn = add i64 %{block}k, {LANES}", f"  %{block}more = icmp slt i64 %{block}kn, %K",
                  f"  br i1 %{block}more, label %{block}, label %{after}"]
        previous = block
    return "\n".join(lines), accs


def _store(accs: list[str], name: str, row: str, column: str) -> str:
    """Reduce one output's accumulators by the lane tree and store it at y[row, column]."""
    return "\n".join([vector_product.lane_tree(accs, name),
                      f"  %{name}o0 = mul i64 {row}, %ys",
                      f"  %{name}o = add i64 %{name}o0, {column}",
                      f"  %{name}p = getelementptr float, ptr %y, i64 %{name}o",
                      f"  store float %{name}, ptr %{name}p, align 4"])


def _row_pass(storage: str, rows: int, tag: str, start: str, exit_label: str) -> str:
    """IR of one pass over the rows of x in blocks of `rows`, from the row `start` gives (a phi's incoming
    values) while a whole block fits, each block against every weight row of the chunk [%n0, %n0e). It is
    entered at `{tag}pre` and leaves for `exit_label`, where the phi `[ %{tag}m0, %{tag}pre ], [ %{tag}mnext,
    %{tag}blkend ]` is the first row it did not take."""
    loop, accs = _k_loop(storage, rows, f"{tag}k", f"{tag}nrow", f"{tag}nend", f"%{tag}xr", f"%{tag}wrow")
    stores = "\n".join(_store(accs[r], f"{tag}s{r}", f"%{tag}mr{r}", f"%{tag}n") for r in range(rows))
    return f"""{_block_entry(rows, tag, start, exit_label, f"{tag}nrow")}
{tag}nrow:
  %{tag}n = phi i64 [ %n0, %{tag}blk ], [ %{tag}n1, %{tag}nend ]
  %{tag}woff = mul i64 %{tag}n, %ws
  %{tag}wrow = getelementptr i8, ptr %w, i64 %{tag}woff
  br label %{tag}k0
{loop}
{tag}nend:
{stores}
  %{tag}n1 = add i64 %{tag}n, 1
  %{tag}nmore = icmp slt i64 %{tag}n1, %n0e
  br i1 %{tag}nmore, label %{tag}nrow, label %{tag}blkend
{_block_exit(rows, tag, exit_label)}"""


def _block_entry(rows: int, tag: str, start: str, exit_label: str, body: str) -> str:
    """IR entering a row pass at `{tag}pre` (the first row from the phi values `start`) and each block of
    `rows` rows of x at `{tag}blk` (row pointers %{tag}xr0, ...), then on to `body`; `exit_label` when no
    whole block is left."""
    pointers = "\n".join(f"  %{tag}mr{r} = add i64 %{tag}m, {r}\n  %{tag}xo{r} = mul i64 %{tag}mr{r}, %xs\n"
                         f"  %{tag}xr{r} = getelementptr float, ptr %x, i64 %{tag}xo{r}" for r in range(rows))
    return f"""{tag}pre:
  %{tag}m0 = phi i64 {start}
  %{tag}lim = sub i64 %M, {rows - 1}
  %{tag}any = icmp slt i64 %{tag}m0, %{tag}lim
  br i1 %{tag}any, label %{tag}blk, label %{exit_label}
{tag}blk:
  %{tag}m = phi i64 [ %{tag}m0, %{tag}pre ], [ %{tag}mnext, %{tag}blkend ]
{pointers}
  br label %{body}"""


def _block_exit(rows: int, tag: str, exit_label: str) -> str:
    """IR ending a block of `rows` rows at `{tag}blkend`: the next block while a whole one is left."""
    return f"""{tag}blkend:
  %{tag}mnext = add i64 %{tag}m, {rows}
  %{tag}again = icmp slt i64 %{tag}mnext, %{tag}lim
  br i1 %{tag}again, label %{tag}blk, label %{exit_label}"""


def _segmented_k_loops(storage: str, rows: int, tag: str, exit_label: str) -> str:
    """The segmented kernel's K loops of `rows` rows (at %{tag}xr0, ...) against the weight row at %{tag}wrow,
    over the segment [%{tag}s, %{tag}se): per group of 16 lanes, its accumulators loaded from the scratch
    (zeros in the first segment, %{tag}first), the loop, the sums stored back; then on to `exit_label`."""
    lines = [f"  br label %{tag}g0pre"]
    for group in range(LANES // _VECTOR):
        head, block, tail = f"{tag}g{group}pre", f"{tag}g{group}", f"{tag}g{group}post"
        after = exit_label if group == LANES // _VECTOR - 1 else f"{tag}g{group + 1}pre"
        lines += [f"{head}:", f"  %{block}k0 = add i64 %{tag}s, {group * _VECTOR}"]
        for r in range(rows):
            lines += [f"  %{block}o{r} = add i64 %{tag}sbase, {(r * LANES // _VECTOR + group) * _VECTOR}",
                      f"  %{block}p{r} = getelementptr float, ptr %scratch, i64 %{block}o{r}",
                      f"  %{block}l{r} = load <16 x float>, ptr %{block}p{r}, align 64",
                      f"  %{block}i{r} = select i1 %{tag}first, <16 x float> zeroinitializer, "
                      f"<16 x float> %{block}l{r}"]
        lines += [f"  br label %{block}", f"{block}:",
                  f"  %{block}k = phi i64 [ %{block}k0, %{head} ], [ %{block}kn, %{block} ]"]
        lines += [f"  %{block}a{r} = phi <16 x float> [ %{block}i{r}, %{head} ], [ %{block}n{r}, %{block} ]"
                  for r in range(rows)]
        lines += vector_product.widened_load(storage, f"%{block}w", f"%{tag}wrow", f"%{block}k")
        for r in range(rows):
            lines += vector_product.lane_multiply_adds(f"%{tag}xr{r}", f"%{block}k", [f"%{block}w"], [f"%{block}a{r}"],
                                                       [f"%{block}n{r}"], f"{block}{r}")
        lines += [f"  %{block}kn = add i64 %{block}k, {LANES}", f"  %{block}more = icmp slt i64 %{block}kn, %{tag}se",
                  f"  br i1 %{block}more, label %{block}, label %{tail}", f"{tail}:"]
        lines += [f"  store <16 x float> %{block}n{r}, ptr %{block}p{r}, align 64" for r in range(rows)]
        lines.append(f"  br label %{after}")
    return "\n".join(lines)


def _segmented_row_pass(storage: str, rows: int, tag: str, start: str, exit_label: str) -> str:
    """`_row_pass` for K above SEGMENTED_ABOVE: per block of `rows` rows of x, the segments of K in order, each
    against every weight row of the chunk, the lane sums kept in %scratch between segments; then each
    output's lane tree from the scratch. The same entry, exit and phi as `_row_pass`."""
    loops = _segmented_k_loops(storage, rows, tag, f"{tag}nend")
    trees = []
    for r in range(rows):
        accs = []
        for group in range(LANES // _VECTOR):
            name = f"%{tag}t{r}g{group}"
            trees += [f"  {name}o = add i64 %{tag}tbase, {(r * LANES // _VECTOR + group) * _VECTOR}",
                      f"  {name}p = getelementptr float, ptr %scratch, i64 {name}o",
                      f"  {name} = load <16 x float>, ptr {name}p, align 64"]
            accs.append(name)
        trees.append(_store(accs, f"{tag}s{r}", f"%{tag}mr{r}", f"%{tag}tn"))
    tree_lines = "\n".join(trees)
    return f"""{_block_entry(rows, tag, start, exit_label, f"{tag}seg")}
{tag}seg:
  %{tag}s = phi i64 [ 0, %{tag}blk ], [ %{tag}snext, %{tag}segend ]
  %{tag}first = icmp eq i64 %{tag}s, 0
  %{tag}sc = add i64 %{tag}s, {SEGMENT}
  %{tag}slast = icmp slt i64 %K, %{tag}sc
  %{tag}se = select i1 %{tag}slast, i64 %K, i64 %{tag}sc
  br label %{tag}nrow
{tag}nrow:
  %{tag}n = phi i64 [ %n0, %{tag}seg ], [ %{tag}n1, %{tag}nend ]
  %{tag}woff = mul i64 %{tag}n, %ws
  %{tag}wrow = getelementptr i8, ptr %w, i64 %{tag}woff
  %{tag}nrel = sub i64 %{tag}n, %n0
  %{tag}sbase = mul i64 %{tag}nrel, {ROWS * LANES}
{loops}
{tag}nend:
  %{tag}n1 = add i64 %{tag}n, 1
  %{tag}nmore = icmp slt i64 %{tag}n1, %n0e
  br i1 %{tag}nmore, label %{tag}nrow, label %{tag}segend
{tag}segend:
  %{tag}snext = add i64 %{tag}s, {SEGMENT}
  %{tag}smore = icmp slt i64 %{tag}snext, %K
  br i1 %{tag}smore, label %{tag}seg, label %{tag}tree
{tag}tree:
  %{tag}tn = phi i64 [ %n0, %{tag}segend ], [ %{tag}tn1, %{tag}tree ]
  %{tag}trel = sub i64 %{tag}tn, %n0
  %{tag}tbase = mul i64 %{tag}trel, {ROWS * LANES}
{tree_lines}
  %{tag}tn1 = add i64 %{tag}tn, 1
  %{tag}tmore = icmp slt i64 %{tag}tn1, %n0e
  br i1 %{tag}tmore, label %{tag}tree, label %{tag}blkend
{_block_exit(rows, tag, exit_label)}"""


def _tail_passes(storage: str, segmented: bool = False) -> str:
    """The passes of one chunk: blocks of ROWS rows, then one block of each smaller size the rows left
    need (3 rows left: one block of three; 2: of two; then single rows). A prefill of 19 rows passes the
    weight five times instead of seven (four blocks of four and three single rows): each pass reads the
    chunk's weight rows again, and a row's sum is the same whichever block holds it."""
    sizes = list(range(ROWS, 0, -1))
    tags = ["b", *(f"r{size}" for size in sizes[1:-1]), "t"]
    passes, start = [], "[ 0, %chunk ]"
    for i, (size, tag) in enumerate(zip(sizes, tags, strict=True)):
        exit_label = "chunkend" if size == 1 else f"{tags[i + 1]}pre"
        passes.append((_segmented_row_pass if segmented else _row_pass)(storage, size, tag, start, exit_label))
        start = f"[ %{tag}m0, %{tag}pre ], [ %{tag}mnext, %{tag}blkend ]"
    return "\n".join(passes)


def _ir(storage: str, segmented: bool = False) -> str:
    """Weight rows in chunks of CHUNK; per chunk, blocks of ROWS rows of x (then the rows left in blocks of
    fewer, `_tail_passes`), each against every weight row of the chunk: a block of x stays in the L1 cache
    while the chunk's rows pass it, and the chunk stays in L2 while the blocks pass it. `segmented`: a block
    of x passes the chunk a segment of K at a time (`_segmented_row_pass`), its lane sums in a scratch of
    CHUNK x ROWS x 64 floats on the stack (32 KiB)."""
    name = f"rows_product_{storage}{'_segmented' if segmented else ''}"
    scratch = f"\n  %scratch = alloca float, i64 {CHUNK * ROWS * LANES}, align 64" if segmented else ""
    return f"""
define void @{name}(ptr noalias nocapture readonly %x, i64 %xs, i64 %M,
                                    ptr noalias nocapture readonly %w, i64 %ws, ptr noalias nocapture %y,
                                    i64 %ys, i64 %lo, i64 %hi, i64 %K) {{
entry:{scratch}
  %none = icmp sge i64 %lo, %hi
  br i1 %none, label %done, label %chunk
chunk:
  %n0 = phi i64 [ %lo, %entry ], [ %n0e, %chunkend ]
  %n0c = add i64 %n0, {CHUNK}
  %short = icmp slt i64 %hi, %n0c
  %n0e = select i1 %short, i64 %hi, i64 %n0c
  br label %bpre
{_tail_passes(storage, segmented)}
chunkend:
  %more = icmp slt i64 %n0e, %hi
  br i1 %more, label %chunk, label %done
done:
  ret void
}}
"""
