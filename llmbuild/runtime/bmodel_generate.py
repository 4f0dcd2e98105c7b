"""Greedy, multi-turn generation with a vendor LLM bmodel, following LLM-TPU's runtime contract.

The contract is what LLM-TPU's `models/Qwen3/python_demo/chat.cpp` does with the nets that the vendor's
`llm_convert` writes:

- nets by name: `embedding` (input_ids [1,L] i32 -> [1,L,H]), `embedding_cache` ([1,1] -> [1,1,H]),
  `lm_head` ([1,H] -> token id [1,1] i32 when it ends in top-1, else logits), optional `greedy_head`,
  `block_i` (prefill), `block_cache_i` (decode) and optional `block_kv_i` (prefill over a kept history);
- every size from net metadata: max input length = `embedding` input dims[1]; SEQLEN = `block_cache_0`
  input 3 (history_k) dims[1]; hidden = `lm_head` input dims[1];
- prefill: ids zero-padded to the max input length, position ids 0..L-1 then 0, and (when `block_0` has a
  mask input) a [1,1,MAX,MAX] mask filled with the mask value except the causal triangle of the first L
  rows (a dynamic net gets the L x L corner); each block's k/v rows 0..L-1 become the cache; lm_head sees the
  hidden state of row L-1;
- decode of the token at position p (= history length - 1): position id p, a [1,1,1,SEQLEN+1] mask that is
  0 at 0..p-1 and at index SEQLEN (the token itself) and the mask value at p..SEQLEN-1; each block gets the
  whole [1,SEQLEN,KV,d] history and its new k/v row is written at position p (stage 0 of a multi-stage
  `block_cache_i`, the full SEQLEN, as chat.cpp does; the shorter stages of `--use_history_kv` builds are
  not used);
- the mask value follows `embedding_cache`'s output dtype: float16 -> 0xF0E2 (-10000), bfloat16 -> 0xC61C
  (-9984); any other dtype is refused, as chat.cpp does;
- generation stops at an EOS id or when the history reaches SEQLEN (the last token's K/V is never needed).

Hidden states travel between nets as the nets' raw bits (bfloat16 as uint16), as they do on the device; they
are only converted when one net's output dtype differs from the next net's input dtype.

Multi-turn: `generate` continues the conversation held in the KV cache until `reset()`. The new turn's
tokens are the last generated token (whose K/V was never computed) followed by the new prompt:
- with `block_kv_i` nets (`llm_convert --use_history_kv`) they are prefilled against the kept cache, in
  chunks of the max input length, positions continuing from the history (the exact continuation). chat.cpp
  instead starts the new chunk after a cache slot it never filled (the last generated token's), so its
  second turn attends to one zero K/V row; this runner computes that row instead. (chat.cpp's forward_next
  also writes a later turn's decode K/V at row `token_length - 1`, counted from the new chunk only, while
  its position id and mask count the whole history; here row and position are the same p.)
- without them the whole conversation is prefilled again from position 0 (what LLM-TPU's pipeline.py does
  by re-sending the history), and any part beyond the max input length is fed through decode steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmbuild.runtime.bmodel_cmodel import (
    CmodelError,
    CmodelRuntime,
    NetInfo,
    TensorInfo,
    bf16_bits_to_f32,
    f32_to_bf16_bits,
)

# Raw bits of the attention mask's "minus infinity" in chat.cpp, by the dtype of embedding_cache's output.
MASK_BITS = {"float16": 0xF0E2, "bfloat16": 0xC61C}
MASK_VALUE = {"float16": -10000.0, "bfloat16": -9984.0}
# llmbuild's f32 recipes build float32 nets, which LLM-TPU's demos do not take; this runner masks them with
# the same -10000 (any value whose exponential vanishes next to the visible scores would do).
F32_MASK_VALUE = -10000.0


@dataclass
class GenerationStats:
    """Wall times of the last `generate` call, for reports (seconds)."""

    prefill_s: float = 0.0
    decode_s: list[float] = field(default_factory=list)
    prefill_tokens: int = 0


def _to_f32(a: np.ndarray, t: TensorInfo) -> np.ndarray:
    if t.dtype == "bfloat16":
        return bf16_bits_to_f32(a)
    return a.astype(np.float32)


def _encode(values: np.ndarray, t: TensorInfo) -> np.ndarray:
    """float32 values as `t`'s raw storage (bfloat16 -> uint16 bits)."""
    if t.dtype == "bfloat16":
        return f32_to_bf16_bits(values)
    if t.dtype == "float16":
        return values.astype(np.float16)
    if t.dtype == "float32":
        return values.astype(np.float32)
    raise CmodelError(f"input {t.name!r}: expected a float dtype, the net declares {t.dtype}")


def _recast(a: np.ndarray, src: TensorInfo, dst: TensorInfo) -> np.ndarray:
    """A raw output of `src`'s dtype as a raw input of `dst`'s dtype (unchanged when they agree)."""
    if src.dtype == dst.dtype:
        return a
    return _encode(_to_f32(a, src), dst)


class BmodelLM:
    """A decoder-only LLM bmodel (llm_convert's layout) loaded in a `CmodelRuntime`, driven greedily.

    `generate(prompt, n)` returns up to `n` new token ids; a later call continues the same conversation from
    the kept KV cache (see the module docstring) until `reset()`.
    """

    def __init__(self, runtime: CmodelRuntime) -> None:
        self.rt = runtime
        names = set(runtime.net_names())
        for needed in ("embedding", "embedding_cache", "lm_head", "block_0", "block_cache_0"):
            if needed not in names:
                raise CmodelError(f"net {needed!r}: missing; this is not an LLM-TPU style bmodel "
                                  f"(nets: {', '.join(sorted(names))})")
        self.num_layers = 0
        while f"block_{self.num_layers}" in names and f"block_cache_{self.num_layers}" in names:
            self.num_layers += 1
        self.has_history_kv = all(f"block_kv_{i}" in names for i in range(self.num_layers))

        info = runtime.net_info
        self.embed: NetInfo = info("embedding")
        self.embed_cache: NetInfo = info("embedding_cache")
        self.lm_head: NetInfo = info("lm_head")
        self.greedy_head: NetInfo | None = info("greedy_head") if "greedy_head" in names else None
        self.blocks = [info(f"block_{i}") for i in range(self.num_layers)]
        self.blocks_cache = [info(f"block_cache_{i}") for i in range(self.num_layers)]
        self.blocks_kv = [info(f"block_kv_{i}") for i in range(self.num_layers)] if self.has_history_kv else []

        self.max_input_length = self.embed.inputs[0].shapes[0][1]
        hk = self.blocks_cache[0].inputs[3]
        self.seqlen = hk.shapes[0][1]
        self.hidden = self.lm_head.inputs[0].shapes[0][1]
        self.kv_shape = hk.shapes[0]  # [1, SEQLEN, KV heads, head dim]
        self.lmhead_with_topk = self.lm_head.outputs[0].shapes[0][-1] == 1
        self.prefill_mask = len(self.blocks[0].inputs) > 2
        self.is_dynamic = self.blocks[0].is_dynamic
        self.prefill_kv_length = self.blocks_kv[0].inputs[3].shapes[0][1] if self.has_history_kv else 0

        mask_dtype = self.embed_cache.outputs[0].dtype
        if mask_dtype not in MASK_BITS and mask_dtype != "float32":
            raise CmodelError(f"net 'embedding_cache': output dtype {mask_dtype}; the LLM-TPU contract takes "
                              f"float16 or bfloat16 (the attention mask value depends on it)")
        self.mask_dtype = mask_dtype
        self.mask_value = MASK_VALUE.get(mask_dtype, F32_MASK_VALUE)
        self._check_layout()

        self._k = [np.zeros(self.kv_shape, self.blocks_cache[i].inputs[3].np_dtype) for i in range(self.num_layers)]
        self._v = [np.zeros(self.kv_shape, self.blocks_cache[i].inputs[4].np_dtype) for i in range(self.num_layers)]
        self._cached: list[int] = []  # tokens whose K/V fill cache rows 0..len-1
        self._pending: int | None = None  # the last generated token: in the conversation, its K/V not computed
        self._image_rows: list[np.ndarray] = []  # float32 rows for the conversation's image tokens, in order
        self._image_token: int | None = None
        self.stats = GenerationStats()

    # -- checks --------------------------------------------------------------------------------------------

    def _check_layout(self) -> None:
        """Shapes the contract relies on, checked once so a foreign bmodel fails with a message."""
        def expect(ok: bool, net: str, what: str) -> None:
            if not ok:
                raise CmodelError(f"net {net!r}: {what}")

        expect(self.embed.inputs[0].dtype == "int32", "embedding", "input_ids must be int32")
        for i, (b, c) in enumerate(zip(self.blocks, self.blocks_cache, strict=True)):
            expect(len(b.inputs) in (2, 3) and len(b.outputs) == 3, b.name,
                   "a prefill block takes (input_states, position_ids[, attention_mask]) and gives 3 outputs")
            expect(len(c.inputs) == 5 and len(c.outputs) == 3, c.name,
                   "a decode block takes (input_states, position_ids, attention_mask, history_k, history_v)")
            expect(c.inputs[3].shapes[0] == self.kv_shape and c.inputs[4].shapes[0] == self.kv_shape, c.name,
                   f"history_k/v shapes differ from block_cache_0's {self.kv_shape}")
            expect(c.inputs[2].shapes[0] == (1, 1, 1, self.seqlen + 1), c.name,
                   f"attention_mask must be [1,1,1,{self.seqlen + 1}]")
            expect(b.is_dynamic == self.is_dynamic, b.name, "prefill blocks differ in being dynamic")
            expect((len(b.inputs) > 2) == self.prefill_mask, b.name, "prefill blocks differ in taking a mask")
            if self.has_history_kv:
                kv = self.blocks_kv[i]
                expect(len(kv.inputs) == 4 and kv.is_dynamic, kv.name,
                       "a history prefill block is dynamic and takes (input_states, position_ids, "
                       "history_k, history_v)")
        expect(self.max_input_length <= self.seqlen, "embedding",
               f"max input length {self.max_input_length} exceeds SEQLEN {self.seqlen}")

    # -- state ---------------------------------------------------------------------------------------------

    @property
    def history_length(self) -> int:
        """Tokens of the conversation so far (chat.cpp's history_length): cached ones plus the pending one."""
        return len(self._cached) + (self._pending is not None)

    @property
    def conversation(self) -> list[int]:
        return self._cached + ([self._pending] if self._pending is not None else [])

    def reset(self) -> None:
        """Start a new conversation (chat.cpp's clear_kv)."""
        for a in self._k + self._v:
            a.fill(0)
        self._cached = []
        self._pending = None
        self._image_rows = []

    def add_image(self, rows: np.ndarray, image_token: int) -> None:
        """The vision net's rows of an image whose tokens (`image_token`, one per row) the next prompt holds:
        their embeddings are these rows, as LLM-TPU's vision demos copy the vit output over the embedding
        output. Images follow one another in the order their runs of tokens appear."""
        if self._image_token is not None and image_token != self._image_token:
            raise CmodelError(f"image token {image_token}: this conversation's images use {self._image_token}")
        self._image_token = int(image_token)
        self._image_rows.extend(np.asarray(rows, np.float32).reshape(-1, self.hidden))

    def _put_image_rows(self, raw: np.ndarray, t: TensorInfo, tokens: Sequence[int],
                        before: Sequence[int]) -> np.ndarray:
        """`raw` ([1, n, H] embeddings of `tokens`, `t`'s dtype) with the image tokens' rows replaced; `before`:
        the conversation's tokens ahead of them (the image rows they used come first)."""
        if self._image_token is None:
            return raw
        where = np.flatnonzero(np.asarray(tokens) == self._image_token)
        if where.size == 0:
            return raw
        first = int(np.count_nonzero(np.asarray(before, dtype=np.int64) == self._image_token))
        if first + where.size > len(self._image_rows):
            raise CmodelError(f"prompt: {first + where.size} image tokens ({self._image_token}) and rows for "
                              f"{len(self._image_rows)}; add_image() each image first")
        out = np.array(raw)
        out[0, where] = _encode(np.stack(self._image_rows[first:first + where.size]), t)
        return out

    # -- the nets ------------------------------------------------------------------------------------------

    def _mask(self, t: TensorInfo, rows: int, cols: int, visible: np.ndarray) -> np.ndarray:
        """A [1,1,rows,cols] mask in `t`'s raw dtype: 0 where `visible`, the mask value elsewhere."""
        m = np.where(visible, np.float32(0.0), np.float32(self.mask_value)).astype(np.float32)
        return _encode(m.reshape(1, 1, rows, cols), t)

    def _lm_head(self, hidden_raw: np.ndarray, src: TensorInfo) -> int:
        """Token id from one hidden row ([1,H] raw): on chip top-1, or greedy_head / host argmax on logits."""
        x = _recast(hidden_raw.reshape(1, self.hidden), src, self.lm_head.inputs[0])
        out = self.rt.launch("lm_head", [x], convert=False)[0]
        if self.lmhead_with_topk:
            return int(out.reshape(-1)[0])
        if self.greedy_head is not None:
            logits = _recast(out, self.lm_head.outputs[0], self.greedy_head.inputs[0])
            return int(self.rt.launch("greedy_head", [logits], convert=False)[0].reshape(-1)[0])
        return int(np.argmax(_to_f32(out, self.lm_head.outputs[0]).reshape(-1)))

    def _embed(self, tokens: Sequence[int], before: Sequence[int] = ()) -> tuple[np.ndarray, TensorInfo]:
        """Embeddings of up to max_input_length tokens, image rows in place: ([1,n,H] raw, its dtype);
        `before`: the conversation's tokens ahead of them."""
        n = len(tokens)
        if self.embed.is_dynamic:
            ids = np.asarray([tokens], np.int32)
        else:  # chat.cpp zeroes the input buffer and copies the tokens in
            ids = np.zeros((1, self.max_input_length), np.int32)
            ids[0, :n] = tokens
        out = self.rt.launch("embedding", [ids], convert=False)[0]
        return self._put_image_rows(out[:, :n], self.embed.outputs[0], tokens, before), self.embed.outputs[0]

    def _prefill_fresh(self, tokens: Sequence[int]) -> int:
        """chat.cpp forward_first: tokens at positions 0..n-1 through block_i; fills cache rows 0..n-1."""
        n, maxl = len(tokens), self.max_input_length
        hidden, src = self._embed(tokens)
        width = n if self.is_dynamic else maxl
        pos = np.zeros((1, width), np.int32)
        pos[0, :n] = np.arange(n)
        for i, net in enumerate(self.blocks):
            h = _recast(hidden, src, net.inputs[0])
            if not self.is_dynamic:
                padded = np.zeros(net.inputs[0].shapes[0], h.dtype)
                padded[:, :n] = h
                h = padded
            ins = [h, pos]
            if self.prefill_mask:
                r = np.arange(width)
                visible = (r[None, :] <= r[:, None]) & (r[:, None] < n)
                ins.append(self._mask(net.inputs[2], width, width, visible))
            out, k, v = self.rt.launch(net.name, ins, convert=False)
            self._k[i][:, :n] = _recast(k[:, :n], net.outputs[1], self.blocks_cache[i].inputs[3])
            self._v[i][:, :n] = _recast(v[:, :n], net.outputs[2], self.blocks_cache[i].inputs[4])
            hidden, src = out[:, :n], net.outputs[0]
        self._cached = list(tokens)
        return self._lm_head(hidden[:, n - 1], src)

    def _prefill_with_history(self, tokens: Sequence[int]) -> int:
        """chat.cpp forward_first_with_kv: `tokens` at positions after the cached ones, through block_kv_i
        (the causal mask over history + chunk is baked into the dynamic net)."""
        old, n = len(self._cached), len(tokens)
        if old > self.prefill_kv_length:
            raise CmodelError(f"net 'block_kv_0': history of {old} tokens exceeds its {self.prefill_kv_length}")
        hidden, src = self._embed(tokens, self._cached)
        pos = np.arange(old, old + n, dtype=np.int32)[None, :]
        for i, net in enumerate(self.blocks_kv):
            hk = _recast(self._k[i][:, :old], self.blocks_cache[i].inputs[3], net.inputs[2])
            hv = _recast(self._v[i][:, :old], self.blocks_cache[i].inputs[4], net.inputs[3])
            h = _recast(hidden, src, net.inputs[0])
            out, k, v = self.rt.launch(net.name, [h, pos, hk, hv], convert=False)
            self._k[i][:, old:old + n] = _recast(k[:, :n], net.outputs[1], self.blocks_cache[i].inputs[3])
            self._v[i][:, old:old + n] = _recast(v[:, :n], net.outputs[2], self.blocks_cache[i].inputs[4])
            hidden, src = out[:, :n], net.outputs[0]
        self._cached.extend(tokens)
        return self._lm_head(hidden[:, n - 1], src)

    def _decode(self, token: int, *, head: bool = True) -> int:
        """chat.cpp forward_next: `token` at position p = len(cached) through block_cache_i; its K/V go to
        cache row p; returns the next token (-1 with head=False: feeding known tokens skips lm_head)."""
        p, s = len(self._cached), self.seqlen
        if p >= s:
            raise CmodelError(f"net 'block_cache_0': position {p} is past SEQLEN {s}")
        x = self.rt.launch("embedding_cache", [np.array([[token]], np.int32)], convert=False)[0]
        src = self.embed_cache.outputs[0]
        x = self._put_image_rows(x.reshape(1, 1, -1), src, [token], self._cached).reshape(x.shape)
        pos = np.array([[p]], np.int32)
        visible = np.ones(s + 1, bool)
        visible[p:s] = False
        for i, net in enumerate(self.blocks_cache):
            h = _recast(x, src, net.inputs[0])
            mask = self._mask(net.inputs[2], 1, s + 1, visible)
            out, k, v = self.rt.launch(net.name, [h, pos, mask, self._k[i], self._v[i]], convert=False)
            self._k[i][:, p] = _recast(k[:, 0], net.outputs[1], net.inputs[3])
            self._v[i][:, p] = _recast(v[:, 0], net.outputs[2], net.inputs[4])
            x, src = out, net.outputs[0]
        self._cached.append(token)
        return self._lm_head(x, src) if head else -1

    # -- generation ----------------------------------------------------------------------------------------

    def _feed(self, tokens: list[int]) -> int:
        """Put `tokens` after the cached conversation; returns the greedy token that follows them."""
        if self.has_history_kv:
            nxt = -1
            for start in range(0, len(tokens), self.max_input_length):
                chunk = tokens[start:start + self.max_input_length]
                nxt = self._prefill_fresh(chunk) if not self._cached else self._prefill_with_history(chunk)
            return nxt
        # No history prefill: the whole conversation again from position 0, the rest through decode steps.
        whole = self._cached + tokens
        rest = whole[self.max_input_length:]
        nxt = self._prefill_fresh(whole[: self.max_input_length])
        for k, t in enumerate(rest):
            nxt = self._decode(t, head=k == len(rest) - 1)
        return nxt

    def teacher_forced(self, prompt_ids: Sequence[int], forced: Sequence[int]) -> list[int]:
        """The bmodel's top-1 after `prompt_ids` and after each prefix of `forced` (len(forced) predictions):
        what it would pick at every step of a given continuation, not only until its first different pick.
        Starts a new conversation."""
        self.reset()
        predictions = [self._feed([int(t) for t in prompt_ids])]
        for token in forced[:-1]:
            predictions.append(self._decode(int(token)))
        self.reset()
        return predictions

    def generate(self, prompt_ids: Iterable[int], max_new_tokens: int, eos_ids: Iterable[int] = ()) -> list[int]:
        """Greedy continuation of the conversation with `prompt_ids`; returns the new ids (an EOS id that
        ends it included). Stops after `max_new_tokens`, at an EOS id, or when the conversation reaches
        SEQLEN. Call `reset()` first for an independent prompt."""
        prompt = [int(t) for t in prompt_ids]
        eos = {int(t) for t in eos_ids}
        if max_new_tokens <= 0:
            return []
        new = ([self._pending] if self._pending is not None else []) + prompt
        if not new:
            raise CmodelError("generate: an empty prompt and no conversation to continue")
        if self.history_length + len(prompt) >= self.seqlen:
            raise CmodelError(f"generate: the conversation would have {self.history_length + len(prompt)} "
                              f"tokens, SEQLEN is {self.seqlen}; reset() to start a new one")
        if any(t < 0 or t > np.iinfo(np.int32).max for t in prompt):
            raise CmodelError("net 'embedding': a prompt token id is negative or beyond int32")

        self.stats = GenerationStats(prefill_tokens=len(new))
        try:
            t0 = time.perf_counter()
            self._pending = None
            token = self._feed(new)
            self.stats.prefill_s = time.perf_counter() - t0
            self._pending = token
            out = [token]
            while len(out) < max_new_tokens and token not in eos and self.history_length < self.seqlen:
                t0 = time.perf_counter()
                self._pending = None
                token = self._decode(out[-1])
                self._pending = token
                self.stats.decode_s.append(time.perf_counter() - t0)
                out.append(token)
        except BaseException:
            self.reset()  # a half-written cache is no conversation to continue
            raise
        return out


# ----------------------------------------------------------------------------------------------------------
# Command line: one process per chip (a process can hold only one simulator), JSON out for tests and reports


def _ids(text: str) -> list[int]:
    return [int(t) for t in text.replace(",", " ").split()]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m llmbuild.runtime.bmodel_generate BMODEL --prompt 1,2,3 [--turn 4,5] ...`: greedy ids as JSON."""
    import argparse
    import json
    import sys

    from llmbuild.runtime.bmodel_cmodel import bmodel_chip, find_toolchain_lib

    ap = argparse.ArgumentParser(prog="python -m llmbuild.runtime.bmodel_generate", description=main.__doc__)
    ap.add_argument("bmodel")
    ap.add_argument("--lib", help="TPU-MLIR's lib/ directory (default: $LLMBUILD_TPUMLIR_LIB or $TPUC_ROOT/lib)")
    ap.add_argument("--chip", choices=("bm1684x", "bm1688"), help="default: the chip the bmodel was built for")
    ap.add_argument("--prompt", type=_ids, required=True, help="token ids, comma or space separated")
    ap.add_argument("--turn", type=_ids, action="append", default=[], help="a later turn's ids (repeatable)")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--eos", type=_ids, default=[])
    ap.add_argument("--json", dest="json_path", help="write the report here (the simulator also prints to stdout)")
    args = ap.parse_args(argv)

    lib = find_toolchain_lib(args.lib)
    chip = args.chip or bmodel_chip(args.bmodel)
    try:
        if lib is None:
            raise CmodelError("no TPU-MLIR lib/ directory: pass --lib or set LLMBUILD_TPUMLIR_LIB")
        if chip is None:
            raise CmodelError(f"{args.bmodel}: cannot tell its chip; pass --chip")
        with CmodelRuntime(lib, chip) as rt:
            rt.load(args.bmodel)
            lm = BmodelLM(rt)
            turns = []
            for prompt in [args.prompt, *args.turn]:
                ids = lm.generate(prompt, args.max_new_tokens, args.eos)
                turns.append({"prompt": prompt, "tokens": ids, "prefill_s": lm.stats.prefill_s,
                              "decode_s": lm.stats.decode_s})
            report = {
                "chip": chip, "bmodel": str(args.bmodel), "conversation": lm.conversation, "turns": turns,
                "sizes": {"layers": lm.num_layers, "max_input_length": lm.max_input_length, "seqlen": lm.seqlen,
                          "hidden": lm.hidden, "kv_shape": list(lm.kv_shape), "mask_dtype": lm.mask_dtype,
                          "history_kv": lm.has_history_kv, "dynamic_prefill": lm.is_dynamic},
                "launch_seconds": {n: {"count": len(v), "median": float(np.median(v)), "total": float(np.sum(v))}
                                   for n, v in rt.launch_seconds.items()},
            }
    except CmodelError as exc:
        print(f"bmodel_generate: error: {exc}", file=sys.stderr)
        return 2
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=1)
    else:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    from llmbuild.runtime.cmodel_yield import reexec_with_yield

    reexec_with_yield()  # the cmodel's polling engines yield: the same ids, sooner
    raise SystemExit(main())
