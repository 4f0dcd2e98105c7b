"""Rules across fields (schema_table.RULES): the stages' shapes, which `source` fields go with which
kind, the prompt given once, a synthetic prompt within its vocabulary.
"""

from __future__ import annotations

from pathlib import Path

from llmbuild.families.registry import family_part_if_any
from llmbuild.recipe import schema_table as st
from llmbuild.recipe.nodes import describe_value, located_error, plain_value
from llmbuild.recipe.validation import Checked
from llmbuild.recipe_types import VENDOR_CHIPS


def _check_stages(out: Checked, top: Path) -> None:
    seq, prefill = out.given["stages.seq_length"], out.given["stages.prefill_length"]
    if prefill.value <= seq.value:
        return
    # Blame the value set in the recipe itself rather than the one it inherited: that is the edit.
    if seq.loc.file == top and prefill.loc.file != top:
        raise located_error(seq.loc, "stages.seq_length", f"expected an integer >= stages.prefill_length "
                                                          f"({prefill.value}, from {prefill.loc}), got {seq.value}")
    raise located_error(prefill.loc, "stages.prefill_length", f"expected an integer <= stages.seq_length "
                                                              f"({seq.value}, from {seq.loc}), got {prefill.value}")


def check_rules(out: Checked, top: Path) -> None:
    raw, given = out.raw, out.given
    _check_stages(out, top)
    _check_source_fields(out)
    chip = raw["target"]["chip"]
    if raw["bmodel"]["build"] and chip not in VENDOR_CHIPS:
        raise located_error(given["bmodel.build"].loc, "bmodel.build", f"expected false for target.chip {chip} "
                            f"(TPU-MLIR compiles for {', '.join(VENDOR_CHIPS)}), got true")
    own = family_part_if_any(raw["vision"]["family"], "family") if raw["vision"]["family"] else None
    if raw["bmodel"]["build"] and own is not None and own.NO_VENDOR_EXPORT:
        raise located_error(given["bmodel.build"].loc, "bmodel.build",
                            f"expected false for {own.NO_VENDOR_EXPORT}, got true")
    # A text family without a vendor path says why in its family module (NO_VENDOR_EXPORT): its recipes build
    # no bmodel by default (bmodel.build absent means "where the vendor can"), and refuse one asked for.
    text = family_part_if_any(raw["architecture"], "family") if isinstance(raw["architecture"], str) else None
    if getattr(text, "NO_VENDOR_EXPORT", None):
        if raw["bmodel"]["build"]:
            raise located_error(given["bmodel.build"].loc, "bmodel.build",
                                f"expected false for {text.NO_VENDOR_EXPORT}, got true")
        raw["bmodel"]["build"] = False
    if raw["bmodel"]["history"] and raw["quantization"]["mode"] == "f32":
        raise located_error(given["bmodel.history"].loc, "bmodel.history",
                            "expected false with quantization.mode f32 (the history form's prefill needs the "
                            "vendor's fused attention, which has no f32 form), got true")
    if raw["bmodel"]["cores"] == 2 and chip != "bm1688":
        raise located_error(given["bmodel.cores"].loc, "bmodel.cores", f"expected 1 for target.chip {chip} (two "
                            "cores are the BM1688's), got 2")
    verify = raw["verify"]
    if verify["prompt"] is not None and verify["prompt_ids"] is not None:
        raise located_error(given["verify.prompt"].loc, "verify.prompt",
                            "expected either prompt or prompt_ids, got both")
    vocab = (raw["source"]["config"] or {}).get("vocab_size")
    if verify["prompt_ids"] and isinstance(vocab, int) and max(verify["prompt_ids"]) >= vocab:
        raise located_error(given["verify.prompt_ids"].loc, "verify.prompt_ids",
                            f"expected ids < source.config.vocab_size ({vocab}), got {max(verify['prompt_ids'])}")


def _check_source_fields(out: Checked) -> None:
    kind = out.raw["source"]["kind"]
    for spec in st.children("source"):
        if spec.kinds is not None and kind not in spec.kinds and spec.path in out.given:
            raise located_error(out.given[spec.path].loc, spec.path,
                                f"expected no {spec.key} for source.kind {kind} (it is for "
                                f"{', '.join(spec.kinds)}), got {describe_value(plain_value(out.given[spec.path]))}")
        if kind in spec.required_for and spec.path not in out.given:
            raise located_error(out.sections["source"].loc, spec.path,
                                f"expected {spec.expected()} (required for source.kind {kind}), got nothing")
    if kind == "synthetic":
        config = out.given["source.config"]
        model_type = config.value.get("model_type")
        if model_type is None or not isinstance(model_type.value, str):
            where = model_type.loc if model_type is not None else config.loc
            got = describe_value(model_type.value) if model_type is not None else "nothing"
            raise located_error(where, "source.config.model_type", f"expected a string, got {got}")
    vision_config = out.given.get("vision.config")
    if vision_config is not None and "vision.family" not in out.given:
        raise located_error(vision_config.loc, "vision.config", "expected vision.family with it (the tower's "
                                                                "definition), got no vision.family")
    if vision_config is not None and kind != "synthetic":
        raise located_error(vision_config.loc, "vision.config", f"expected no vision.config for source.kind {kind} "
                                                                "(the checkpoint's config.json has it)")
    if kind == "gguf":
        has_path, has_pkg, has_file = (f"source.{k}" in out.given for k in ("path", "package", "file"))
        if has_path and (has_pkg or has_file):
            key = "package" if has_pkg else "file"
            raise located_error(out.given[f"source.{key}"].loc, f"source.{key}",
                                "expected either source.path or source.package + source.file, got both")
        if not has_path and not (has_pkg and has_file):
            missing = "file" if has_pkg else "package" if has_file else "path"
            what = "a string" if missing != "path" else "a .gguf path, or source.package + source.file"
            raise located_error(out.sections["source"].loc, f"source.{missing}",
                                f"expected {what} (required for source.kind gguf), got nothing")
