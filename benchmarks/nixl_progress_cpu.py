"""CPU cost of one idle NIXL agent's progress thread, at NIXL's default delay (0: busy
polling) and at the delays the CPU profile may use. Each measurement runs in a fresh process
because the delay patch is process-wide.

    .venv/bin/python benchmarks/nixl_progress_cpu.py [--seconds 5] [--delays 0 1000 10000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

PROBE = """
import json, sys, time
import nixl._api as api
from workbench.knobs import nixl_progress
delay = int(sys.argv[1])
if delay:
    nixl_progress.install(delay, api=api)
agent = api.nixl_agent("probe", api.nixl_agent_config(num_threads=4))
t0, w0 = time.process_time(), time.monotonic()
time.sleep(float(sys.argv[2]))
print(json.dumps({"delay_us": delay,
                  "cpu_share": (time.process_time() - t0) / (time.monotonic() - w0)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--delays", type=int, nargs="+", default=[0, 1000, 10000])
    args = ap.parse_args()
    for d in args.delays:
        out = subprocess.run([sys.executable, "-c", PROBE, str(d), str(args.seconds)],
                             capture_output=True, text=True, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        print(f"pthrDelay {row['delay_us']:>6} us: idle agent uses "
              f"{100 * row['cpu_share']:5.1f}% of a core")


if __name__ == "__main__":
    main()
