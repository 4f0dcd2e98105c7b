"""`llmbuild bmodel-check RECIPE`: the vendor's `.bmodel` run on the vendor's own simulator (the cmodel of
the recipe's chip, through `libbmrt`: runtime/bmodel_cmodel.py) against the transformers reference the build
already streamed (reference.safetensors), writing bmodel.json; `llmbuild verify` applies the tolerances.

- Nets: a layer's prefill net on the reference's first rows (its hidden states in, its hidden states, keys
  and values out), its decode net on the next row with the reference's keys and values of the rows before
  as the history, and in the history form its history-prefill net on a chunk after a history; `lm_head`
  on the last hidden state (the token id against the reference's top-1), the embedding nets against the
  table. Every net of a small model; at real size the decode net of the sampled layers (the first, middle
  and last: the cmodel takes tens of seconds per decode block of a 1.5B) and the head's nets, lm_head by
  its twin `lm_head_logits` (lm_head without the top-1, compiled for the check: its logits against the
  reference's, its weights lm_head's bytes), since the cmodel takes minutes over the vendor's top-1 of a
  real vocabulary and seconds over the product before it (docs/bmodel.md has the figures). A
  vision-language recipe's `vit` net on the vision step's tile (MiniCPM-V: pieces of several grids) against
  transformers' image features, for a small model (a real-size tower on the cmodel takes hours).
- End to end, for small models: the greedy ids LLM-TPU's runtime contract gives on the cmodel
  (runtime/bmodel_generate.py) against transformers' `generate` in the reference.
- At real size each checked part runs in a job of its own as soon as it is combined (`--part head`,
  `--part lm_head`, `--part layer_I`: the head's bmodel, lm_head's twin, a sampled layer's), so the
  cmodel's minutes overlap the compile jobs instead of following the final combine on one core. Each part
  records the digest of every net it ran (bmodel/combine.py's `net_digests`: its description with its data
  ranges' sha256); the final check finds the same digests in the combined binary (verify fails on any other
  bytes), loads the binary into the cmodel where it fits a job (a 7B's 5.35 GB does not) and runs its
  `embedding_cache` net there (the binary as a board loads it), and gathers the parts' results.

The vendor's last block also applies the model's final norm (bmodel/top_export.py), so the last layer's
output is compared with the reference's output after that norm, computed here in float64.
"""

from __future__ import annotations

import json
import time
from functools import cached_property
from pathlib import Path

import numpy as np
from safetensors import safe_open

from llmbuild import LlmbuildError
from llmbuild.artifacts.layer_weights import tensor_source
from llmbuild.artifacts.paths import LM_HEAD_LOGITS_NET, BuildPaths, read_spec, vlm_dir, write_json
from llmbuild.bmodel.combine import coeff_memories, net_digest, net_digests, net_views
from llmbuild.bmodel.flat_schema import Schema, load_schema
from llmbuild.families.spec import ModelSpec
from llmbuild.recipe_types import Recipe
from llmbuild.runtime.bmodel_cmodel import CmodelRuntime
from llmbuild.runtime.bmodel_generate import F32_MASK_VALUE, MASK_VALUE, BmodelLM
from llmbuild.runtime.bmodel_run import quiet_simulator
from llmbuild.runtime.cmodel_yield import engines_yield
from llmbuild.vendor_toolchain import locate
from llmbuild.verify.bmodel_check_policy import check_parts, checked_layers, is_small
from llmbuild.verify.similarity import similarity
from llmbuild.verify.vision_cases import vendor_cases

E2E_TOKENS = 16
COVERAGE_AT_REAL_SIZE = ("decode of the sampled layers, the head's nets (lm_head by its twin without the top-1); "
                         "a vision-language model's vit net is compiled, not run")


def check_bmodel(recipe: Recipe, part: str | None = None, load_binary: bool = True) -> dict:
    """The final check (`part` None) or one part's; writes bmodel.json or the part's JSON. `load_binary`: the
    final check of a real-size model loads the whole binary into the cmodel (steps/resources.py decides:
    where it fits a job)."""
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    chain = locate()
    started = time.perf_counter()
    small = is_small(spec)
    if part is not None and part not in check_parts(spec):
        raise LlmbuildError(f"bmodel-check --part {part}: expected one of {', '.join(check_parts(spec)) or 'none'} "
                            "(a small model is checked whole)")
    binary = _part_binary(recipe, paths, part)
    nets: dict[str, dict] = {}
    e2e, launches, loaded = None, {}, small or load_binary
    if loaded:
        with quiet_simulator(), safe_open(str(paths.reference), "np") as ref, \
                CmodelRuntime(chain.lib, recipe.target.chip) as rt:
            rt.load(binary)
            checker = _NetChecks(recipe, paths, spec, ref, rt)
            if part == "head":
                nets = checker.embeddings()
            elif part == "lm_head":
                nets = {"lm_head": checker.lm_head_logits()}
            elif part is not None:
                layer = int(part.removeprefix("layer_"))
                nets = {f"block_cache_{layer}": checker.decode(layer)}
            elif small:
                nets = checker.run()
                if recipe.vision is not None:
                    nets["vit"] = _vit(recipe, paths, rt)
                e2e = _end_to_end(recipe, spec, ref, rt)
            else:
                nets = {"embedding_cache": checker.embedding_cache()}
            launches = {name: round(float(np.mean(t)), 3) for name, t in rt.launch_seconds.items()}
    report = {
        "recipe": recipe.name,
        "binary": binary.name,
        "simulator": f"TPU-MLIR {chain.root.parent.name.removeprefix('tpu-mlir-') or ''} cmodel, {recipe.target.chip}",
        "coverage": "every net" if small else COVERAGE_AT_REAL_SIZE,
        "binary_loaded": loaded,
        "nets": nets,
        "end_to_end": e2e,
        "launch_seconds": launches,
        "engines_yield": engines_yield(),  # the launches' seconds depend on it, not the results
    }
    # A part's digests are what the final check finds in the binary: the bytes of the nets the part ran.
    schema = load_schema(chain.bmodel_schema)
    if part == "lm_head":
        # The twin answers for the head's lm_head net where its weights are that net's bytes (verify fails
        # otherwise); the final check then finds that net in the binary.
        twin = _one_net(schema, binary, LM_HEAD_LOGITS_NET)
        head = _one_net(schema, paths.bmodel_head, "lm_head")
        nets["lm_head"]["weights_equal_lm_head"] = coeff_memories(twin) == coeff_memories(head)
        digests = {"lm_head": net_digest(head)}
    else:
        digests = net_digests(schema, binary) if part is not None or check_parts(spec) else {}
    report["seconds"] = round(time.perf_counter() - started, 1)
    if part is not None:
        report["net_digests"] = {name: digests[name] for name in nets if name in digests}
        write_json(paths.bmodel_part_checks(part), report)
        return report
    if check_parts(spec):
        _gather_parts(report, paths, spec, digests)
    write_json(paths.bmodel_checks, report)
    return report


def _one_net(schema: Schema, path: Path, net: str) -> dict:
    """One net of a bmodel as `net_views` shows it; a file without it is one line naming both."""
    view = net_views(schema, path, {net}).get(net)
    if view is None:
        raise LlmbuildError(f"{path}: no net {net!r}")
    return view


def _part_binary(recipe: Recipe, paths: BuildPaths, part: str | None) -> Path:
    """The bmodel a check loads: the binary, or a part's (the head's, lm_head's twin, a layer's)."""
    if part is None:
        return paths.bmodel(recipe.name)
    if part == "head":
        return paths.bmodel_head
    if part == "lm_head":
        return paths.bmodel_net(LM_HEAD_LOGITS_NET)
    return paths.bmodel_layer(int(part.removeprefix("layer_")))


def _gather_parts(report: dict, paths: BuildPaths, spec: ModelSpec, in_binary: dict[str, str]) -> None:
    """The parts' results into the final report (this check's own runs on the whole binary kept over theirs),
    and which of the nets they ran the binary holds other bytes for (verify fails on any)."""
    own = report["nets"]
    report["nets"], differing, count = {}, [], 0
    for name in check_parts(spec):  # each part's nets, checked in its own job before the combine
        path = paths.bmodel_part_checks(name)
        done = json.loads(path.read_text())
        if "net_digests" not in done:
            raise LlmbuildError(f"{path}: no net_digests (a part check of an older llmbuild): run "
                                f"`llmbuild bmodel-check {report['recipe']} --part {name}` again")
        report["nets"].update(done["nets"])
        report["launch_seconds"] = {**done["launch_seconds"], **report["launch_seconds"]}
        report["seconds"] = round(report["seconds"] + done["seconds"], 1)
        count += len(done["net_digests"])
        differing += [net for net, digest in done["net_digests"].items() if in_binary.get(net) != digest]
    report["nets"].update(own)
    report["parts_in_binary"] = {"nets": count, "differing": differing}


class _NetChecks:
    def __init__(self, recipe: Recipe, paths: BuildPaths, spec: ModelSpec, ref, rt: CmodelRuntime):
        self.recipe, self.paths, self.spec, self.ref, self.rt = recipe, paths, spec, ref, rt
        self.ids = ref.get_tensor("ids").astype(np.int64)
        self.S, self.L = recipe.stages.seq_length, recipe.stages.prefill_length
        self.history = recipe.bmodel.history
        self.n = min(self.L, len(self.ids) - 1)  # prefill rows; the next row is the decode check's

    @cached_property
    def mask_value(self) -> float:
        """LLM-TPU reads the mask value off `embedding_cache`'s output type; a layer's own bmodel has no such
        net, and its decode net's mask input is of the same (activation) type."""
        nets = self.rt.net_names()
        mask_dtype = self.rt.net_info("embedding_cache").outputs[0].dtype if "embedding_cache" in nets else \
            self.rt.net_info(next(n for n in nets if n.startswith("block_cache_"))).inputs[2].dtype
        return MASK_VALUE.get(mask_dtype, F32_MASK_VALUE)

    def run(self) -> dict[str, dict]:
        """Every net of a small model."""
        out: dict[str, dict] = {}
        for i in checked_layers(self.spec):
            out[f"block_{i}"] = self.prefill(i)
            if self.history:
                out[f"block_kv_{i}"] = self.prefill_kv(i)
            out[f"block_cache_{i}"] = self.decode(i)
        out.update(self.head())
        return out

    def expected(self, layer: int, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = self.ref
        hidden = r.get_tensor(f"layers.{layer}.output")[rows]
        if layer == self.spec.num_layers - 1:
            hidden = self.final_norm(hidden)
        return hidden, r.get_tensor(f"layers.{layer}.k")[rows], r.get_tensor(f"layers.{layer}.v")[rows]

    @cached_property
    def norm_gamma(self) -> np.ndarray:
        return np.asarray(tensor_source(self.recipe, self.paths).tensor("norm.weight"), np.float64)

    def final_norm(self, hidden: np.ndarray) -> np.ndarray:
        x = hidden.astype(np.float64)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.spec.rms_norm_eps) * self.norm_gamma

    def compare(self, net: str, got: list[np.ndarray], want: tuple[np.ndarray, ...]) -> dict:
        names = ("hidden_states", "k", "v")
        outputs = {name: similarity(np.asarray(g, np.float32).reshape(w.shape), w.astype(np.float32))
                   for name, g, w in zip(names, got, want, strict=True)}
        return {"outputs": outputs}

    def prefill(self, layer: int) -> dict:
        net, n = f"block_{layer}", self.n
        x = self.ref.get_tensor(f"layers.{layer}.input")[:n]
        info = self.rt.net_info(net)
        rows = n if info.is_dynamic else self.L
        hidden = np.zeros((1, rows, self.spec.hidden_size), np.float32)
        hidden[0, :n] = x
        pos = np.zeros((1, rows), np.int32)
        pos[0, :n] = np.arange(n)
        inputs = [hidden, pos]
        if len(info.inputs) > 2:
            mask = np.full((1, 1, rows, rows), self.mask_value, np.float32)
            mask[0, 0, :n, :n] = np.where(np.tril(np.ones((n, n), bool)), 0.0, self.mask_value)
            inputs.append(mask)
        out = self.rt.launch(net, inputs)
        got = [out[0][0, :n], out[1][0, :n], out[2][0, :n]]
        return self.compare(net, got, self.expected(layer, slice(0, n)))

    def history_cache(self, layer: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        kvh, d = self.spec.num_kv_heads, self.spec.head_dim
        k = np.zeros((1, self.S, kvh, d), np.float32)
        v = np.zeros((1, self.S, kvh, d), np.float32)
        k[0, :rows] = self.ref.get_tensor(f"layers.{layer}.k")[:rows]
        v[0, :rows] = self.ref.get_tensor(f"layers.{layer}.v")[:rows]
        return k, v

    def decode(self, layer: int) -> dict:
        """The token at position n with the reference's keys and values of rows 0..n-1 as its history."""
        net, p = f"block_cache_{layer}", self.n
        x = self.ref.get_tensor(f"layers.{layer}.input")[p:p + 1].reshape(1, 1, -1)
        mask = np.full((1, 1, 1, self.S + 1), self.mask_value, np.float32)
        mask[..., :p] = 0.0
        mask[..., self.S] = 0.0
        k, v = self.history_cache(layer, p)
        out = self.rt.launch(net, [x, np.array([[p]], np.int32), mask, k, v])
        return self.compare(net, [out[0][0], out[1][0], out[2][0]], self.expected(layer, slice(p, p + 1)))

    def prefill_kv(self, layer: int) -> dict:
        """A chunk after a history (the history form's dynamic net: real lengths, no mask input)."""
        net = f"block_kv_{layer}"
        a = self.n // 2
        c = self.n - a
        x = self.ref.get_tensor(f"layers.{layer}.input")[a:a + c][None]
        k, v = self.history_cache(layer, a)
        pos = np.arange(a, a + c, dtype=np.int32)[None]
        out = self.rt.launch(net, [x, pos, k[:, :a], v[:, :a]])
        got = [out[0][0, :c], out[1][0, :c], out[2][0, :c]]
        return self.compare(net, got, self.expected(layer, slice(a, a + c)))

    def head(self) -> dict[str, dict]:
        return {"lm_head": self.lm_head(), **self.embeddings()}

    def last_hidden(self) -> np.ndarray:
        """lm_head's input: the last row of the reference's sequence (whose logits the reference keeps) after
        the final norm."""
        return self.final_norm(self.ref.get_tensor(f"layers.{self.spec.num_layers - 1}.output")[-1:]).astype(np.float32)

    def lm_head(self) -> dict:
        """The token lm_head picks against the reference's top-1."""
        token = int(self.rt.launch("lm_head", [self.last_hidden()])[0].reshape(-1)[0])
        return _token_against(token, self.ref.get_tensor("logits"))

    def lm_head_logits(self) -> dict:
        """lm_head's twin without the top-1: its logits against the reference's, and their top-1 as the token.
        The vendor's top-1 over a real vocabulary is most of a real-size head's time on the cmodel; the twin
        carries lm_head's very weights (the part check compares their bytes), and the top-1 itself runs in
        every tiny recipe's check."""
        logits = self.rt.launch(LM_HEAD_LOGITS_NET, [self.last_hidden()])[0].reshape(-1)
        reference = self.ref.get_tensor("logits")
        return {**_token_against(int(np.argmax(logits)), reference), "run_as": LM_HEAD_LOGITS_NET,
                "outputs": {"logits": similarity(logits, reference)}}

    def embeddings(self) -> dict[str, dict]:
        """`embedding` and `embedding_cache` against what transformers' own embedding gave (the first layer's
        input): the dequantized table where a quantized lm_head is tied to it."""
        out: dict[str, dict] = {}
        ids, want = self.ids[:self.n], self.ref.get_tensor("layers.0.input")[:self.n]
        padded = np.zeros((1, self.L), np.int32)
        padded[0, :self.n] = ids
        emb = self.rt.launch("embedding", [padded])[0][0, :self.n]
        out["embedding"] = {"outputs": {"hidden_states": similarity(emb, want)}}
        out["embedding_cache"] = self.embedding_cache()
        return out

    def embedding_cache(self) -> dict:
        """One token's row against what transformers' own embedding gave it."""
        ids, want = self.ids[:self.n], self.ref.get_tensor("layers.0.input")[:self.n]
        one = self.rt.launch("embedding_cache", [np.array([[ids[-1]]], np.int32)])[0].reshape(1, -1)
        return {"outputs": {"hidden_states": similarity(one, want[-1:])}}


def _token_against(token: int, logits: np.ndarray) -> dict:
    """A picked token beside the reference's top-1, with the gap and scale verify's near-tie rule reads."""
    first, second = np.argsort(logits)[::-1][:2]
    return {"token": token, "reference_token": int(first),
            "reference_top2_gap": round(float(logits[first] - logits[second]), 6),
            "reference_logit_scale": round(float(np.max(np.abs(logits))), 6)}


def _vit(recipe: Recipe, paths: BuildPaths, rt: CmodelRuntime) -> dict:
    """The vit net on the vision step's pseudo-random pieces (InternVL: one tile; MiniCPM-V: pieces of several
    grids, fed as LLM-TPU's runtime feeds them) against transformers' own image features (the net's tokens
    [T, hidden] are the reference's [1, T, hidden]); `image_features` is the worst case's, which verify holds to
    vision.image_cosine. A small model's only: a real-size tower is not run on the cmodel (InternVL3.5-2B's, 24
    InternViT layers over 1025 tokens, had not finished one tile after 89 minutes), which the coverage says."""
    assert recipe.vision is not None
    info = rt.net_info("vit")
    cases = vendor_cases(recipe.vision.family, vlm_dir(recipe, paths), {"pixel_values": info.input_shapes()[0]})
    results = {}
    for case, inputs, want in cases:
        got = rt.launch("vit", inputs)[0]
        results[case] = (int(got.shape[0]), similarity(got.reshape(want.shape), want))
    # The lowest cosine; a NaN one lower still (NaN passes no threshold).
    worst = min(results, key=lambda c: (not np.isnan(results[c][1]["cosine"]), results[c][1]["cosine"]))
    out = {"case": worst, "tokens": results[worst][0], "image_features": results[worst][1]}
    if len(results) > 1:
        out["cases"] = {case: sim for case, (_, sim) in results.items()}
    return out


def _end_to_end(recipe: Recipe, spec: ModelSpec, ref, rt: CmodelRuntime) -> dict:
    """Greedy ids free-running, and teacher-forced: the bmodel's pick at every step of the reference's own
    continuation, beside the reference's top-2 gap there (a different pick where the gap is tiny is a
    near tie of the float reference, not a fault; verify decides with the recipe's tolerances)."""
    prompt = [int(i) for i in ref.get_tensor("generate.prompt_ids")]
    want = [int(i) for i in ref.get_tensor("generate.ids")]
    logits = ref.get_tensor("generate.logits")
    count = min(E2E_TOKENS, len(want))
    lm = BmodelLM(rt)
    started = time.perf_counter()
    got = lm.generate(prompt, count, eos_ids=spec.eos_token_ids)
    seconds = time.perf_counter() - started
    want = want[:count]
    first = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if first is None and len(got) != len(want):
        first = min(len(got), len(want))
    forced = lm.teacher_forced(prompt, want)
    steps = []
    for k, (pick, token) in enumerate(zip(forced, want, strict=True)):
        if pick != token:
            top = np.sort(logits[k])[::-1]
            steps.append({"step": k, "token": pick, "reference_token": token,
                          "reference_top2_gap": round(float(top[0] - top[1]), 6),
                          "reference_logit_scale": round(float(np.max(np.abs(logits[k]))), 6)})
    gap = next((s["reference_top2_gap"] for s in steps if s["step"] == first), None)
    return {"ids": got, "reference_ids": want, "tokens_equal": first is None, "first_difference": first,
            "reference_top2_gap_at_difference": gap, "teacher_forced_ids": forced,
            "teacher_forced_differing": steps, "seconds": round(seconds, 1)}


__all__ = ["check_bmodel", "check_parts", "checked_layers"]
