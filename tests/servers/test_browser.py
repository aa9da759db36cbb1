"""JupyterLab in headless Chromium: open the explorer, run its cells, set a knob, click Run,
see the figure appear, and find the knob value read back from D in the run's result.json.

Run with ``make browser-test`` (installs Debian's chromium through scripts/install-chromium.sh);
excluded from ``make test``. Playwright drives the system Chromium (``executable_path``):
Playwright's own browser download is not used. A screenshot goes to $WB_SCREENSHOT
(default /tmp/wb/explorer.png).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import papermill as pm
import pytest

from workbench import paths
from workbench.serving.servers import free_port

pytestmark = [pytest.mark.browser, pytest.mark.vllm]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
KERNEL_READY = """() => {
    const w = window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return Boolean(k) && k.connectionStatus === 'connected' && k.status === 'idle';
}"""
SCREENSHOT = Path(os.environ.get("WB_SCREENSHOT", "/tmp/wb/explorer.png"))


@pytest.fixture()
def lab(tmp_path):
    """A JupyterLab server on a free port serving tmp_path/root; yields (url, token, root)."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} missing: run scripts/install-chromium.sh")
    root = tmp_path / "root"
    root.mkdir()
    token = secrets.token_hex(16)
    port = free_port()
    venv_bin = str(Path(sys.executable).parent)
    settings = tmp_path / "lab-settings"  # a fresh user-settings dir: no kernel dialog, no news
    for rel, data in (
        ("@jupyterlab/notebook-extension/tracker.jupyterlab-settings",
         {"autoStartDefaultKernel": True}),
        ("@jupyterlab/apputils-extension/notification.jupyterlab-settings",
         {"fetchNews": "false", "checkForUpdates": False}),
    ):
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(data))
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces")}
    log = (tmp_path / "jupyter-lab.log").open("w")  # closed in finally
    proc = subprocess.Popen(
        [str(Path(venv_bin) / "jupyter"), "lab", "--no-browser", f"--ServerApp.token={token}",
         f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.root_dir={root}",
         "--ServerApp.port_retries=0", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status = httpx.get(f"{url}/api/status", params={"token": token}, timeout=2)
                if status.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("jupyter lab did not start:\n"
                                   + (tmp_path / "jupyter-lab.log").read_text()[-3000:])
            time.sleep(0.5)
        yield url, token, root
    finally:
        try:  # shut the kernels down first, then the server (its whole process group)
            for k in httpx.get(f"{url}/api/kernels", params={"token": token}, timeout=5).json():
                httpx.delete(f"{url}/api/kernels/{k['id']}", params={"token": token}, timeout=30)
        except (httpx.HTTPError, ValueError):
            pass
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def test_explorer_in_jupyterlab_runs_and_shows_the_plot(lab, pd_session, base_cfg, tmp_path):
    from playwright.sync_api import sync_playwright

    url, token, root = lab
    cfg = replace(base_cfg, num_prompts=2, max_tokens=8)
    pd_session.ensure(cfg)
    attach = {"urls": {r: s.url for r, s in pd_session.servers.items()},
              "knobs_file": str(pd_session.knobs_file), "state_dir": str(pd_session.state_dir)}
    out = tmp_path / "explorer-out"
    d = cfg.to_dict()
    # The notebook as a user would open it, with this test's parameters injected (not run).
    pm.execute_notebook(
        str(paths.REPO / "notebooks" / "explorer.ipynb"), str(root / "explorer.ipynb"),
        parameters={"interactive": True, "attach": attach, "out_dir": str(out),
                    "config": {k: d[k] for k in ("target", "drafter", "block_size",
                                                 "kv_cache_bytes", "max_model_len", "seed")},
                    "prompt_set": cfg.prompt_set, "num_prompts": 2, "max_tokens": 8,
                    "k_p": cfg.k_p, "k_d": cfg.k_d},
        prepare_only=True, kernel_name="python3",
    )

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"{url}/lab/tree/explorer.ipynb?token={token}", wait_until="domcontentloaded")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
            # wait until the notebook's kernel is connected and idle, then Run All Cells
            page.wait_for_function(KERNEL_READY, timeout=180_000)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

            panel = page.locator(".wb-explorer")
            panel.wait_for(state="visible", timeout=180_000)
            finalize = panel.locator(".widget-dropdown", has_text="finalize").locator("select")
            finalize.select_option("eager")
            panel.get_by_role("button", name="Run").click()
            page.wait_for_function(
                "() => { const i = document.querySelector('img.wb-plot');"
                " return i !== null && i.naturalWidth > 100; }", timeout=300_000)
            page.wait_for_selector(".wb-table table", timeout=30_000)
            status = panel.locator(".widget-html", has_text="done in").first
            status.wait_for(timeout=30_000)
            table_text = panel.locator(".wb-table").inner_text()
            panel.locator("img.wb-plot").scroll_into_view_if_needed()
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT))
            shutil.copy(SCREENSHOT, tmp_path / "explorer.png")
        finally:
            browser.close()

    assert "eager" in table_text, table_text
    result = json.loads((out / "runs" / "run001-rep1" / "result.json").read_text())
    assert result["complete"] and result["knobs"]["d"]["finalize"] == "eager"
    assert result["config"]["num_prompts"] == 2
    assert SCREENSHOT.stat().st_size > 10_000
