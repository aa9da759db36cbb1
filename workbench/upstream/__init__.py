"""``python -m workbench upstream``: each finding in the form vLLM merges, run as vLLM runs it.

``upstream/<finding-id>/`` holds a pytest written for vLLM's own ``tests/`` tree (its place
named in its first lines), built on vLLM's helpers of the same release, and ``ISSUE.md``. The
command takes the installed release's ``tests/`` from its source distribution
(``tree.py``), places each test there, and runs it against the installed vLLM (it must fail,
for the finding's reason) and against a dev build with the finding's fix
(``patches/vllm-<release>/<id>.patch``, ``devbuild.make``; it must pass), or says ``no
patch`` (``command.py``). No vLLM code is copied into this repository.
"""
