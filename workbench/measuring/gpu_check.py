"""Pass/fail of GPU runs against vLLM's reference, per position: the end of ``gpu-check.sh``.

``python -m workbench.measuring.gpu_check DIR...`` reads each ``DIR/result.json`` and prints, for D
(``pd``) and the baseline, every position's rate and the acceptance length against the
reference of the run's profile (``profiles.GPU_EXPECTED``: vLLM's test's 2.60 and
[0.7296, 0.5208, 0.3545]) with the test's two-sided relative tolerance (5%), as
``profiles.check_expected`` judges it. Exit status 1 when any side of any run fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..inputs import profiles
from .results import Result


def verdict_lines(name: str, result: Result) -> tuple[list[str], bool]:
    """The lines for one run, and whether every side passed."""
    expected = profiles.get(result.config.get("profile", "cpu")).expected
    if not expected:
        return [f"{name}: profile {result.config.get('profile')!r} has no reference"], False
    lines, ok = [], True
    for side in ("pd", "baseline"):
        s = getattr(result, side)
        if not s:
            continue
        check = profiles.check_expected(s, expected)
        ok &= check["pass"]
        cells = [f"pos{i} {m:.4f} vs {r:.4f} ({e:+.1%})" for i, (m, r, e) in enumerate(zip(
            s["per_position"], expected["per_position"], check["rel_err_per_position"],
            strict=False))]
        lines.append(f"{name} {side}: {'PASS' if check['pass'] else 'FAIL'}  length "
                     f"{s['acceptance_length']:.3f} vs {expected['acceptance_length']:.2f} "
                     f"({check['rel_err_acceptance_length']:+.1%}); " + "; ".join(cells))
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    all_ok = bool(dirs)
    for d in dirs:
        lines, ok = verdict_lines(d.name, Result.load(d))
        all_ok &= ok
        print("\n".join(lines))
    print(f"reference check: {'PASS' if all_ok else 'FAIL'} (±5% per position and on the "
          "length, vLLM's test tolerance)")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
