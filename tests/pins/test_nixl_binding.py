"""NIXL's progress-thread delay reaches the real ``nixl._api`` agent config (a subprocess)."""

from __future__ import annotations

import json

NIXL_PROBE = """
import json, sys
import nixl._api as api
from workbench.knobs import nixl_progress
assert nixl_progress.install(int(sys.argv[1]), api=api)
cfg = api.nixlBind.nixlAgentConfig()
cfg.pthrDelay = 0              # what nixl_agent.__init__ writes
zero = cfg.pthrDelay
cfg.pthrDelay = 7              # any other value passes through
agent = api.nixl_agent("probe", api.nixl_agent_config(num_threads=1))
print(json.dumps([zero, cfg.pthrDelay]))
"""


def test_nixl_progress_delay_reaches_the_real_agent_config():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NIXL_PROBE, "1000"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1000, 7]
