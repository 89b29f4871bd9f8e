"""schedule/ and sim/ must not import torch (DESIGN.md: the scheduler and simulator are plain)."""

import subprocess
import sys

MODULES = ["rcllm.schedule", "rcllm.schedule.validate", "rcllm.schedule.vidur_fit",
           "rcllm.schedule.fit", "rcllm.sim", "rcllm.sim.engine", "rcllm.sim.experiments",
           "rcllm.sim.bench", "rcllm.sim.cli", "rcllm.sim.placement", "rcllm.sim.traces",
           "rcllm.sim.plots"]


def test_schedule_and_sim_import_no_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            + "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "", f"torch imported: {out.stdout.strip()[:200]}"
