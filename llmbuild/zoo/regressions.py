"""What got worse since the previous run (docs/zoo.md, "Regressions"): a recipe that stopped building, a
verification margin that dropped, greedy tokens that changed, a build or a binary more than 10% slower or
larger. The nightly script fails on any of them."""

from __future__ import annotations

from llmbuild.zoo.benchmarks import step_of

GROWTH = 0.10  # slower or larger by more than this fraction
# Builds timed on a shared machine vary by a few tenths of a second whatever the code does: a tiny model's
# whole build is seconds, so below this many seconds of difference no slowdown is reported.
MIN_SECONDS = 1.0
# Similarities are stored to 7 digits (verify/checks.py); a drop smaller than that is rounding.
MARGIN_EPSILON = 1e-7


def find(previous: dict | None, current: dict) -> list[dict]:
    """One entry per regression of `current` against `previous` ({recipe, kind, message, before, after});
    [] without a previous run. Recipes new in this run, or no longer selected, have nothing to regress from."""
    if previous is None:
        return []
    found = []
    for name, now in sorted(current["recipes"].items()):
        before = previous["recipes"].get(name)
        if before is None:
            continue
        if before.get("status") == "verified" and now.get("status") != "verified":
            found.append(_entry(name, "stopped building", f"{now.get('status')} at {now.get('step')}: "
                                f"{now.get('message')}", "verified", now.get("status")))
        if before.get("status") == "verified" and now.get("status") == "verified":
            found += _margins(name, before, now) + _tokens(name, before, now) + _growth(name, before, now)
    return found


def _entry(recipe: str, kind: str, message: str, before: object, after: object) -> dict:
    return {"recipe": recipe, "kind": kind, "message": message, "before": before, "after": after}


def _margins(name: str, before: dict, now: dict) -> list[dict]:
    found = []
    for key, old in (before.get("margins") or {}).items():
        new = (now.get("margins") or {}).get(key)
        if old is not None and new is not None and new < old - MARGIN_EPSILON:
            found.append(_entry(name, "margin dropped", f"{key} margin {old:.7g} -> {new:.7g}", old, new))
    return found


def _tokens(name: str, before: dict, now: dict) -> list[dict]:
    old, new = before.get("tokens"), now.get("tokens")
    if old is None or new is None or old == new:
        return []
    at = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    return [_entry(name, "tokens changed", f"greedy ids differ from position {at}", old, new)]


def _growth(name: str, before: dict, now: dict) -> list[dict]:
    found = []
    old, new = before.get("build_seconds"), now.get("build_seconds")
    if old and new and new > old * (1 + GROWTH) and new - old >= MIN_SECONDS:
        found.append(_entry(name, "build slower", f"build {old:.1f} s -> {new:.1f} s "
                            f"(+{100 * (new / old - 1):.0f}%; most in {_slowest_step(before, now)})", old, new))
    old, new = before.get("binary_bytes"), now.get("binary_bytes")
    if old and new and new > old * (1 + GROWTH):
        found.append(_entry(name, "binary larger", f"binary {old} -> {new} bytes (+{100 * (new / old - 1):.0f}%)",
                            old, new))
    return found


def _slowest_step(before: dict, now: dict) -> str:
    """The step whose time grew the most (shards of one step added up)."""
    def by_step(result: dict) -> dict[str, float]:
        steps: dict[str, float] = {}
        for rule, values in (result.get("rules") or {}).items():
            steps[step_of(rule)] = steps.get(step_of(rule), 0.0) + (values.get("seconds") or 0.0)
        return steps

    old, new = by_step(before), by_step(now)
    growth = {step: seconds - old.get(step, 0.0) for step, seconds in new.items()}
    return max(growth, key=growth.__getitem__) if growth else "?"
