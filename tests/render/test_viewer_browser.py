"""The plan viewer (`Plan.visualize("x.html")`, `Plan.diff(...).visualize(...)`) in a real browser.

Chromium (Debian's `chromium` and `chromium-driver` packages) is driven headless through Selenium, from
file:// with no network. What the page shows is checked against independent sources: stored names and byte
offsets against the safetensors header parsed here with `struct`/`json`, the RoPE permutation against
llama.cpp's `permute` written out with numpy, node counts against the plan's networkx graph. Skipped where
selenium, chromium or chromedriver is missing; `test_script_parses_with_node` needs only node.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

import lazyweights as lw
from lazyweights import DType

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and os.path.exists(p)), None)
CHROMEDRIVER = next((p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver") if p and os.path.exists(p)),
                    None)
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromedriver are needed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900",
              "--disable-background-networking", "--no-first-run"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_llama):
    """A 2-layer Llama checkpoint with 2 heads of 16 rows (q) and 1 kv head (k): RoPE gathers of 16 indices."""
    d = str(tmp_path_factory.mktemp("viewer") / "ckpt")
    cfg = tiny_llama(d, layers=2, hidden=32, heads=2, kv=1)
    return d, cfg


@pytest.fixture(scope="module")
def tiny(ckpt, w1_plan):
    return w1_plan(*ckpt)


def _header(path: str) -> dict:
    """The safetensors header, read here: tensor name -> absolute byte offset of its data in the file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: 8 + n + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def _open(drv, path: str):
    drv.get("file://" + os.path.abspath(path))
    drv.get_log("browser")  # (drop messages of the previous page)
    drv.refresh()
    assert drv.execute_script("return document.body.dataset.ready") == "1"


def _errors(drv) -> list:
    return [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def _click(drv, css: str):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    el = drv.find_element(By.CSS_SELECTOR, css)
    ActionChains(drv).move_to_element(el).click().perform()
    return el


def _panel(drv) -> dict:
    """The details panel's table as {field: value}, and its full text under ''."""
    from selenium.webdriver.common.by import By

    info = drv.find_element(By.ID, "info")
    rows = {}
    for tr in info.find_elements(By.CSS_SELECTOR, "tr"):
        tds = tr.find_elements(By.CSS_SELECTOR, "td")
        rows[tds[0].text] = tds[1].text
    rows[""] = info.text
    return rows


def _transform(drv, pane=0) -> tuple[float, float, float]:
    t = drv.execute_script(
        "return document.querySelectorAll('.pane')[arguments[0]].querySelector('.scene:not([hidden]) .viewport')"
        ".getAttribute('transform')", pane)
    x, y, k = map(float, re.fullmatch(r"translate\(([-\d.]+),([-\d.]+)\) scale\(([-\d.]+)\)", t).groups())
    return x, y, k


@pytest.fixture(scope="module")
def page(tiny, tmp_path_factory):
    return tiny.visualize(str(tmp_path_factory.mktemp("page") / "plan.html"))


# --- the page ----------------------------------------------------------------------------------------------
def test_page_loads_without_console_errors(browser, page):
    _open(browser, page)
    assert _errors(browser) == []
    assert browser.execute_script("return document.querySelectorAll('.pane').length") == 1
    # the help text is in the panel until something is clicked
    assert "Sources (left)" in _panel(browser)[""]


def test_click_source_shows_stored_name_file_and_offset(browser, page, ckpt):
    _open(browser, page)
    _click(browser, "#grouped")  # the ungrouped view: one source node per stored tensor
    path = os.path.join(ckpt[0], "model.safetensors")
    offsets = _header(path)
    name = "model.layers.1.self_attn.q_proj.weight"
    node_id = browser.execute_script(
        "const s=JSON.parse(document.getElementById('plan-data').textContent).panes[0].scenes.full;"
        "for(const id in s){if(s[id].title.endsWith(' source')&&s[id].search.split(' ').includes(arguments[0]))"
        "return id;}", name)
    _click(browser, f".scene[data-scene=full] .node[data-id={node_id}]")
    rows = _panel(browser)
    assert rows["tensor"] == name
    assert rows["file"] == path
    assert rows["offset"].startswith(f"{offsets[name]:#x} ({offsets[name]} bytes into model.safetensors)")
    assert rows["stored"].startswith("bf16[32,32]")
    assert "1 block" in rows["runs in"] and "fused step" in rows["runs in"]
    # everything else is dimmed; the node's own chain is not
    dimmed = browser.execute_script(
        "return Array.from(document.querySelectorAll('.scene:not([hidden]) .node.dim')).map(e=>e.dataset.id)")
    assert node_id not in dimmed and len(dimmed) > 20
    _click(browser, "#grouped")  # back to grouped


def test_click_rope_gather_names_it_with_axis_and_pattern(browser, page):
    _open(browser, page)
    take = browser.execute_script(
        "return Array.from(document.querySelectorAll('.scene:not([hidden]) .node.op-take'))"
        ".map(e=>[e.dataset.id, e.querySelector('.t1').textContent])")
    assert take and all("RoPE gather[axis=1]" in label for _, label in take)
    _click(browser, f".scene:not([hidden]) .node[data-id={take[0][0]}]")
    rows = _panel(browser)
    # llama.cpp's permute (convert_hf_to_gguf.py LlamaModel.permute) of one 16-row head, written out with numpy;
    # W1 undoes it: its gather is the inverse permutation.
    llama_permute = np.arange(16).reshape(1, 2, 8).swapaxes(1, 2).reshape(-1)
    inverse = np.argsort(llama_permute)
    assert inverse.tolist() == list(range(0, 16, 2)) + list(range(1, 16, 2))
    assert rows["gather"] == "RoPE row permutation (interleaved -> halves)"
    assert rows["axis"] == "1 (length 16)"
    assert rows["indices"] == "[0:16:2,1:16:2] (16 indices)"
    assert rows["in"] in ("bf16[2,16,32]", "bf16[1,16,32]")


def test_click_output_shows_step_blocks_and_chain(browser, page, tiny):
    from lazyweights.compiler.steps import compile_steps

    _open(browser, page)
    _click(browser, "#grouped")
    name = "layers.1.attention.q_proj.weight"
    _click(browser, f'.scene[data-scene=full] .node.out[data-name="{name}"]')
    rows = _panel(browser)
    steps = compile_steps(tiny)
    index = next(i for i, s in enumerate(steps) if name in s.outputs)
    st = steps[index]
    assert rows["output"] == name
    assert rows["type"] == "f16[32,32] (float16)"
    assert rows["step"] == f"fused, compiler step {index + 1} of {len(steps)}"
    assert rows["blocks"].startswith(f"{len(st.blocks)} block")
    assert rows["read"] == "2 KiB from sources" and rows["written"] == "2 KiB"  # 32 x 32 bf16 in, f16 out
    text = rows[""]
    assert "chain (inputs first)" in text
    assert "'model.layers.1.self_attn.q_proj.weight'" in text and "cast[f16]" in text
    assert "from bfloat16; to float16" in text
    # a chain entry is a link: it selects that node
    from selenium.webdriver.common.by import By

    links = browser.find_elements(By.CSS_SELECTOR, "#info a.go")
    assert len(links) == 5  # source, reshape, take, reshape, cast
    links[2].click()
    assert _panel(browser)["gather"].startswith("RoPE row permutation")
    _click(browser, "#grouped")


def test_hover_highlights_node_and_edges(browser, page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    _open(browser, page)
    el = browser.find_element(By.CSS_SELECTOR, ".scene:not([hidden]) .node.op-cast")
    ActionChains(browser).move_to_element(el).perform()
    assert "hov" in el.get_attribute("class")
    node_id = el.get_attribute("data-id")
    edges = browser.find_elements(By.CSS_SELECTOR, f'.scene:not([hidden]) .edge[data-to="{node_id}"]')
    assert edges and all("hov" in e.get_attribute("class") for e in edges)
    tip = browser.find_element(By.ID, "tip")
    assert tip.is_displayed() and "cast[" in tip.text
    ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
    assert "hov" not in el.get_attribute("class")


def test_search_by_tensor_name(browser, page):
    from selenium.webdriver.common.by import By

    _open(browser, page)
    box = browser.find_element(By.ID, "search")
    for view_toggle in (False, True):
        if view_toggle:
            _click(browser, "#grouped")
        box.clear()
        box.send_keys("model.layers.1.self_attn.k_proj.weight")  # a stored name: its source node only
        hits = browser.find_elements(By.CSS_SELECTOR, ".scene:not([hidden]) .node.hit")
        assert len(hits) == 1 and "op-source" in hits[0].get_attribute("class")
        assert browser.find_element(By.ID, "hits").text == "1 match"
        box.clear()
        box.send_keys("layers.*.attention.q_proj.weight")  # a glob over output names
        outs = browser.find_elements(By.CSS_SELECTOR, ".scene:not([hidden]) .node.out.hit")
        names = {o.get_attribute("data-name") for o in outs}
        assert names == ({"layers.0.attention.q_proj.weight", "layers.1.attention.q_proj.weight"} if view_toggle
                         else {"layers.{0,1}.attention.q_proj.weight"})
        box.clear()
        box.send_keys("no_such_tensor")
        assert browser.find_element(By.ID, "hits").text == "no match"
        assert not browser.find_elements(By.CSS_SELECTOR, ".scene:not([hidden]) .node.hit")
    box.clear()


def test_grouped_and_ungrouped_views(browser, page, tiny):
    from selenium.webdriver.common.by import By

    g = tiny.to_networkx()
    _open(browser, page)
    visible = ".scene:not([hidden]) .node"
    grouped = len(browser.find_elements(By.CSS_SELECTOR, visible))
    _click(browser, "#grouped")
    assert browser.execute_script("return document.querySelector('.scene:not([hidden])').dataset.scene") == "full"
    full = browser.find_elements(By.CSS_SELECTOR, visible)
    assert len(full) == g.number_of_nodes() + len(tiny.outputs)  # every plan node and every output
    assert grouped < len(full)
    outs = {e.get_attribute("data-name") for e in browser.find_elements(By.CSS_SELECTOR, ".scene:not([hidden]) .out")}
    assert outs == set(tiny.outputs)
    _click(browser, "#grouped")
    assert len(browser.find_elements(By.CSS_SELECTOR, visible)) == grouped


def test_zoom_and_pan_change_the_transform(browser, page):
    from selenium.webdriver.common.action_chains import ActionChains, ScrollOrigin
    from selenium.webdriver.common.by import By

    _open(browser, page)
    x0, y0, k0 = _transform(browser)
    canvas = browser.find_element(By.CSS_SELECTOR, ".canvas")
    ActionChains(browser).scroll_from_origin(ScrollOrigin.from_element(canvas), 0, -300).perform()  # wheel up: in
    x1, y1, k1 = _transform(browser)
    assert k1 > k0 * 1.2
    _click(browser, "#zoom-out")
    assert _transform(browser)[2] == pytest.approx(k1 * 0.8, rel=1e-3)
    # drag the empty canvas by (80, 40): the translation moves by as much, the scale stays
    xa, ya, ka = _transform(browser)
    h1 = browser.find_element(By.TAG_NAME, "h1")
    ActionChains(browser).move_to_element(h1).perform()
    ActionChains(browser).move_to_element_with_offset(canvas, 250, 150).click_and_hold().move_by_offset(40, 20) \
        .move_by_offset(40, 20).release().perform()
    xb, yb, kb = _transform(browser)
    assert (xb - xa, yb - ya, kb) == (pytest.approx(80, abs=1), pytest.approx(40, abs=1), pytest.approx(ka))
    _click(browser, "#fit")
    assert _transform(browser) == pytest.approx((x0, y0, k0))


# --- the diff page ----------------------------------------------------------------------------------------
def test_diff_page_marks_changed_and_one_sided_outputs(browser, tiny, tmp_path):
    from selenium.webdriver.common.by import By

    changed = {k: v.astype(DType.bfloat16) if "k_proj" in k else v for k, v in tiny.tensors.items()}
    del changed["norm.weight"]
    changed["lm_head.weight"] = tiny.tensors["embed_tokens.weight"]
    d = tiny.diff(lw.plan(changed), labels=("W1", "W1 with bf16 k_proj"))
    path = d.visualize(str(tmp_path / "diff.html"))
    _open(browser, path)
    assert _errors(browser) == []
    assert len(browser.find_elements(By.CSS_SELECTOR, ".pane")) == 2
    titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".pane-title")]
    assert titles[0].startswith("W1:") and titles[1].startswith("W1 with bf16 k_proj:")
    _click(browser, "#grouped")

    def marked(pane, cls):
        return {e.get_attribute("data-name") for e in browser.find_elements(
            By.CSS_SELECTOR, f'.pane[data-pane="{pane}"] .scene:not([hidden]) .out.{cls}')}

    k_proj = {"layers.0.attention.k_proj.weight", "layers.1.attention.k_proj.weight"}
    assert marked(0, "diff-changed") == k_proj and marked(1, "diff-changed") == k_proj
    assert marked(0, "diff-only") == {"norm.weight"} and marked(1, "diff-only") == {"lm_head.weight"}
    _click(browser, '.pane[data-pane="1"] .scene:not([hidden]) .out[data-name="layers.1.attention.k_proj.weight"]')
    text = _panel(browser)[""]
    # the same output in the other plan is outlined too
    sel = browser.execute_script(
        "return Array.from(document.querySelectorAll('.scene:not([hidden]) .node.sel')).map(e=>"
        "[e.closest('.pane').dataset.pane, e.dataset.name])")
    assert sorted(sel) == [["0", "layers.1.attention.k_proj.weight"], ["1", "layers.1.attention.k_proj.weight"]]
    assert "differences" in text
    # astype on the f16 output adds a cast: the chain gains one line
    assert "+ %5:bf16[16,32] = cast[bf16] %4" in text and "  %4:f16[16,32] = cast[f16] %3" in text
    # the list in the help panel finds an output by name
    _click(browser, "#grouped")
    browser.execute_script("document.getElementById('info').innerHTML=document.getElementById('help').innerHTML")
    link = browser.find_element(By.CSS_SELECTOR, '#info a.go[data-name="norm.weight"]')
    link.click()
    assert _panel(browser)["output"] == "norm.weight"


# --- the script itself ----------------------------------------------------------------------------------------
@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_script_parses_with_node(tiny, tmp_path):
    from lazyweights.render.visualize import viewer_asset

    js = tmp_path / "viewer.js"
    js.write_text(viewer_asset("viewer.js"))
    subprocess.run([NODE, "--check", str(js)], check=True, capture_output=True, timeout=60)
    # and the script exactly as a page inlines it
    text = open(tiny.visualize(str(tmp_path / "p.html")), encoding="utf-8").read()
    scripts = re.findall(r"<script>(.*?)</script>", text, re.S)
    assert len(scripts) == 1
    inline = tmp_path / "inline.js"
    inline.write_text(scripts[0])
    proc = subprocess.run([NODE, "--check", str(inline)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
