"""Loads the workbench's compat_fixes.py by file path (no workbench package in this env)."""
import importlib.util
import os
import sys

# The checkout's workbench/releases/compat_fixes.py; workbench.releases.trial sets it for the
# servers it starts. Unset: this env runs its release with no fix (and says so on stderr).
PATH = os.environ.get("WORKBENCH_COMPAT_FIXES", "")
_DONE = []


def register():
    if _DONE:
        return _DONE[0]
    if not PATH:
        print("workbench release fixes: WORKBENCH_COMPAT_FIXES not set, no fix applied",
              file=sys.stderr)
        _DONE.append([])
        return _DONE[0]
    spec = importlib.util.spec_from_file_location("workbench_compat_fixes", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    _DONE.append(mod.install())
    return _DONE[0]
