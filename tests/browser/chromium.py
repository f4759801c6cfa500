"""Debian's Chromium driven by Playwright, and what the browser tests do in JupyterLab
with it: shared by tests/browser (a JupyterLab of this venv) and the notebook pod's
tests (tests/kubernetes: JupyterLab in a pod, through a port-forward)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeout

CHROMIUM = "/usr/bin/chromium"
DASHBOARD = ".jp-OutputArea-output:has(.edl-progress)"
# Whether a cell's output (not its source, which the page shows too) holds `text`.
OUTPUT_SAYS = """text => [...document.querySelectorAll('.jp-OutputArea-output')]
    .some(output => output.innerText.includes(text))"""


# Records every value the progress bar shows, as the page applies it: a busy machine may
# paint the page rarely while a short job runs, but each update still changes the DOM.
RECORD_PROGRESS = f"""() => {{
    window.edlProgress = [];
    new MutationObserver(() => {{
        const bar = document.querySelector("{DASHBOARD} .edl-progress");
        const v = bar && parseFloat(bar.getAttribute("aria-valuenow"));
        const seen = window.edlProgress;
        if (bar && seen[seen.length - 1] !== v) seen.push(v);
    }}).observe(document.body, {{subtree: true, childList: true, attributes: true}});
}}"""


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium (Playwright's Browser). Playwright's sync API runs its event
    loop in this thread for as long as it is started, and any asyncio code then finds
    that loop running: so start it for a module, not a session."""
    if not Path(CHROMIUM).exists():
        raise AssertionError(
            f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)."
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--no-first-run", "--disable-sync",
            ],
        )  # fmt: skip
        try:
            yield browser
        finally:
            browser.close()


def run_all_cells(page) -> None:
    """Wait for the open notebook's kernel, then Run ▸ Run All Cells, as a user would."""
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    kernel_choice = page.locator(".jp-Dialog .jp-mod-accept")
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    # The first kernel of a fresh environment can take minutes to start (seen in CI):
    # Run All before it is idle runs nothing at all, so wait, and say so if it never is.
    deadline = time.monotonic() + 240
    while not idle.count():
        assert time.monotonic() < deadline, "the notebook's kernel never became idle"
        if kernel_choice.count():  # "Select Kernel": take the default, Python 3
            kernel_choice.click()
        time.sleep(0.2)
    started = page.locator(".jp-CodeCell .jp-InputPrompt", has_text=re.compile(r"\[[*0-9]"))
    for _ in range(3):  # a Run All that the kernel missed is given again
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:
            started.first.wait_for(timeout=30_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError("Run All Cells did not start the notebook's first cell")
