"""`llmbuild verify RECIPE`: apply the recipe's tolerances to every recorded check, write verify.json,
and fail naming the first layer, stage and op that diverged."""

from __future__ import annotations

import json

from llmbuild import LlmbuildError
from llmbuild.artifacts.paths import BuildPaths, read_spec, write_json
from llmbuild.locations import bmodel_allowed
from llmbuild.recipe_types import Recipe, builds_bmodel

STAGE_ORDER = ("embedding", "embedding_cache", "prefill", "prefill_kv", "decode", "lm_head")


def _load(path) -> dict:
    if not path.is_file():
        raise LlmbuildError(f"{path}: missing; the compile step that writes it has not run")
    return json.loads(path.read_text())


def verify(recipe: Recipe) -> dict:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    v = recipe.verify
    failures: list[str] = []
    checked = 0
    per_net = [_load(paths.head_metrics)] + [_load(paths.layer_metrics(i)) for i in range(spec.num_layers)]
    # Walk the model in execution order: embedding, layers 0..N-1, lm_head.
    walk = [(per_net[0], s) for s in ("embedding", "embedding_cache")]
    for m in per_net[1:]:
        walk += [(m, s) for s in ("prefill", "prefill_kv", "decode")]
    walk.append((per_net[0], "lm_head"))
    worst = {"top_vs_source": 1.0, "tpu_vs_top": 1.0}
    for metrics, stage in walk:
        entry = metrics["stages"].get(stage)
        layer = metrics["layer"]
        where = f"net {stage}" if layer == "head" else f"layer {layer}, stage {stage}"
        if entry is None:
            failures.append(f"{where}: no reference check was recorded")
            continue
        for name, s in entry["top_vs_source"].items():
            checked += 1
            worst["top_vs_source"] = min(worst["top_vs_source"], s["cosine"])
            if s["cosine"] < v.top_cosine or s["euclid"] < v.top_euclid:
                failures.append(f"{where}: top vs source diverged at output {name} "
                                f"(cosine {s['cosine']}, euclid {s['euclid']})")
        diverged = [(loc, c, e) for loc, c, e in entry["tpu_vs_top"]["ops"] if c < v.tpu_cosine or e < v.tpu_euclid]
        output_failed = False
        for name, s in entry["tpu_vs_top"]["outputs"].items():
            checked += 1
            worst["tpu_vs_top"] = min(worst["tpu_vs_top"], s["cosine"])
            if s["cosine"] < v.tpu_cosine or s["euclid"] < v.tpu_euclid:
                output_failed = True
                first_op = diverged[0][0] if diverged else "(no single op below tolerance)"
                failures.append(f"{where}: tpu vs top diverged at output {name} "
                                f"(cosine {s['cosine']}, euclid {s['euclid']}); first op: {first_op}")
        # Every op is held to the same tolerances as the outputs: an op can diverge (a NaN, whose
        # similarity is -1, or a wrong tile) where the output still looks close.
        checked += len(entry["tpu_vs_top"]["ops"])
        if diverged and not output_failed:
            loc, c, e = diverged[0]
            failures.append(f"{where}: tpu vs top diverged at op {loc} (cosine {c}, euclid {e})"
                            + (f" and {len(diverged) - 1} more ops" if len(diverged) > 1 else ""))
    e2e = _load(paths.e2e)
    if v.exact_tokens and not e2e["tokens_equal"]:
        failures.append(f"end to end: greedy ids part from transformers at step {e2e['first_difference']} "
                        f"(top-2 logit gap there {e2e['top2_gap_at_difference']})")
    # Every step of the teacher-forced run is held to the logits tolerance (older e2e.json: the first).
    steps = e2e.get("step_logits") or [e2e["first_logits"]]
    worst_step = min(range(len(steps)), key=lambda k: steps[k]["cosine"])
    if not steps[worst_step]["cosine"] >= v.logits_cosine:  # NaN fails too
        failures.append(f"end to end: step {worst_step} logits cosine {steps[worst_step]['cosine']} "
                        f"< {v.logits_cosine}")
    if e2e.get("chat_template_ids_equal") is False:
        # The runtime renders the chat template itself (`llmbuild chat`); the reference used transformers'.
        failures.append("end to end: the binary's chat template gives other prompt ids for verify.prompt than "
                        "transformers' apply_chat_template")
    image = e2e.get("image")
    if image is not None:
        if v.exact_tokens and not image["tokens_equal"]:
            gap = image.get("reference_top2_gap_at_difference")
            failures.append(f"end to end with an image: greedy ids part from transformers at step "
                            f"{image['first_difference']}" + ("" if gap is None else f" (reference top-2 gap {gap})"))
        if not image["first_logits"]["cosine"] >= v.logits_cosine:  # NaN fails too
            failures.append(f"end to end with an image: first-step logits cosine {image['first_logits']['cosine']} "
                            f"< {v.logits_cosine}")
    dequant = _load(paths.dequant_check) if paths.dequant_check.is_file() else None
    if dequant is not None and dequant.get("equal") is False:
        failures.append(f"independent dequantization: {dequant['first_differing']} as llmbuild reads it differs "
                        f"from {dequant['library']} (max abs difference {dequant['max_abs_difference']}): the "
                        "compiler and the reference share that reading")
    bmodel = _bmodel_verdict(recipe, paths, failures) if builds_bmodel(recipe) and bmodel_allowed() else None
    report = {
        "recipe": recipe.name,
        "passed": not failures,
        "failures": failures,
        "checks": checked,
        "worst_cosine": worst,
        "tolerances": {"top_cosine": v.top_cosine, "top_euclid": v.top_euclid, "tpu_cosine": v.tpu_cosine,
                       "tpu_euclid": v.tpu_euclid, "logits_cosine": v.logits_cosine,
                       "exact_tokens": v.exact_tokens},
        "end_to_end": {**{k: e2e[k] for k in ("tokens_equal", "first_difference", "top2_gap_at_difference",
                                             "reference_top2_gap_at_difference", "steps_differing",
                                             "first_logits", "chat_template_ids_equal") if k in e2e},
                       "worst_step_logits": {"step": worst_step, **steps[worst_step]}},
    }
    if dequant is not None:
        # equal: True or False where an independent implementation read the tensors, None where none did.
        report["independent_dequantization"] = {k: dequant.get(k) for k in ("applies", "library", "equal", "why")} | {
            "tensors": len(dequant.get("tensors", []))}
    if bmodel is not None:
        report["bmodel"] = bmodel
    if image is not None:
        shown = ("tokens_equal", "first_difference", "top2_gap_at_difference", "reference_top2_gap_at_difference",
                 "first_logits")
        report["end_to_end_image"] = {k: image[k] for k in shown if k in image}
    failed = paths.root / "verify.failed.json"
    if failures:
        write_json(failed, report)
        raise LlmbuildError(f"{recipe.name}: verification failed: {failures[0]}"
                            + (f" (and {len(failures) - 1} more, see verify.failed.json)" if len(failures) > 1 else ""))
    failed.unlink(missing_ok=True)  # an earlier run's failure, now passed, must not be read as this build's
    write_json(paths.verify, report)
    return report


def _bmodel_verdict(recipe: Recipe, paths: BuildPaths, failures: list[str]) -> dict:
    """The vendor bmodel's checks on the cmodel (verify/bmodel_checks.py) held to the device tolerances: each
    net's outputs to tpu_cosine and tpu_euclid against the reference (the vit net's image features to
    vision.image_cosine, as the .llmb's); a token the bmodel picks other than the
    reference's top-1 passes only where the reference's top-2 gap is within what the tolerance's relative
    error allows on its logits (a near tie), and in an exact-token recipe not at all."""
    v = recipe.verify
    checks = _load(paths.bmodel_checks)
    worst = 1.0
    for net, entry in checks["nets"].items():
        for name, s in entry.get("outputs", {}).items():
            worst = min(worst, s["cosine"])
            if not (s["cosine"] >= v.tpu_cosine and s["euclid"] >= v.tpu_euclid):  # NaN fails too
                failures.append(f"bmodel net {net}: output {name} diverged from the reference on the "
                                f"{recipe.target.chip} cmodel (cosine {s['cosine']}, euclid {s['euclid']})")
    vit = checks["nets"].get("vit")
    if vit is not None and recipe.vision is not None:
        cos = vit["image_features"]["cosine"]
        worst = min(worst, cos)
        if not cos >= recipe.vision.image_cosine:  # NaN fails too
            failures.append(f"bmodel net vit: image features cosine {cos} on the {recipe.target.chip} cmodel, "
                            f"below vision.image_cosine {recipe.vision.image_cosine}")
    head = checks["nets"]["lm_head"]
    if head.get("weights_equal_lm_head") is False:
        failures.append(f"bmodel net lm_head: its twin {head['run_as']}, which the cmodel ran, holds other weight "
                        "bytes than lm_head")
    allowance = (1.0 - v.tpu_euclid) * head.get("reference_logit_scale", 0.0)
    if head["token"] != head["reference_token"] and (v.exact_tokens or head["reference_top2_gap"] > allowance):
        failures.append(f"bmodel net lm_head: token {head['token']}, the reference's top-1 is "
                        f"{head['reference_token']} (top-2 gap {head['reference_top2_gap']})")
    differing = checks.get("parts_in_binary", {}).get("differing", [])
    if differing:
        failures.append(f"bmodel {checks['binary']}: nets {', '.join(differing)} are not the bytes their part "
                        "checks ran on the cmodel")
    e2e = checks.get("end_to_end")
    if e2e is not None:
        if v.exact_tokens and not e2e["tokens_equal"]:
            failures.append(f"bmodel end to end on the {recipe.target.chip} cmodel: greedy ids part from "
                            f"transformers at step {e2e['first_difference']}")
        for step in e2e["teacher_forced_differing"]:
            near_tie = step["reference_top2_gap"] <= (1.0 - v.tpu_euclid) * step["reference_logit_scale"]
            if v.exact_tokens or not near_tie:
                failures.append(f"bmodel end to end on the {recipe.target.chip} cmodel: in the reference's "
                                f"context, step {step['step']} picks {step['token']}, not {step['reference_token']} "
                                f"(reference top-2 gap {step['reference_top2_gap']})")
                break
    return {"binary": checks["binary"], "simulator": checks["simulator"], "coverage": checks["coverage"],
            "nets_checked": len(checks["nets"]), "worst_cosine": worst,
            "binary_loaded": checks.get("binary_loaded", True),
            "end_to_end": None if e2e is None else {
                **{k: e2e[k] for k in ("tokens_equal", "first_difference", "reference_top2_gap_at_difference")},
                "teacher_forced_steps": len(e2e["teacher_forced_ids"]),
                "teacher_forced_differing": len(e2e["teacher_forced_differing"])}}
