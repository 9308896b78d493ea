"""report.html in a real headless browser (Debian's chromium, driven through the DevTools
protocol: tests/compare/browser.py): the page is loaded, its scripts run, a tree node is clicked
with real mouse events and the DOM is read back. One browser for the module. Screenshots are
written in the test's temporary folder (never into git)."""
from __future__ import annotations

import os
import shutil

import pytest

torch = pytest.importorskip("torch")

from ts_core.compare import compare  # noqa: E402
from ts_core.compare.report.html import write_html  # noqa: E402

from browser import CHROMIUM, SKIP_REASON, Browser  # noqa: E402
from compare_models import dump_mix as dump  # noqa: E402


def _set_diagnosis(result, diagnosis):
    """The diagnosis belongs to the pair holding the first divergence (CompareResult.diagnosis reads it)."""
    next(p for p in result.pairs if p.first_divergence is result.first_divergence).diagnosis = diagnosis

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)]

# hand-made hypotheses in the format of explain/diagnosis.py (COMMON interface): the page must
# render whatever the diagnosis says, best first
DIAGNOSIS = [
    {"cause": "activation_approx", "title": "GELU uses the tanh approximation in target", "confidence": 0.92,
     "evidence": "recorded argument approximate: golden 'none', target 'tanh'; the difference curve matches "
                 "erf-GELU minus tanh-GELU (max 4.7e-4)", "needs_tensors": False},
    {"cause": "precision", "title": "precision of the output dtype", "confidence": 0.08,
     "evidence": "errors of 3e-4 exceed float32 ulp", "needs_tensors": True},
    {"cause": "inherited", "title": "error inherited from upstream", "confidence": 0.02,
     "evidence": "inputs match (cosine 1.0)", "needs_tensors": True},
    {"cause": "constant_scale", "title": "constant scale", "confidence": 0.01, "evidence": "ratio not constant",
     "needs_tensors": False},
]


@pytest.fixture(scope="module")
def browser():
    b = Browser(width=1400, height=1800)
    yield b
    b.close()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 3-block model whose block 1 GELU uses tanh in target; two step/rank units: "rank" (the
    bug) and "rank7" (a copy of golden: clean)."""
    d = tmp_path_factory.mktemp("report")
    golden = dump(d / "golden")
    target = dump(d / "target", bug={"approximate": "tanh"})
    shutil.copytree(os.path.join(golden, "step0", "rank"), os.path.join(target, "step0", "rank7"))
    shutil.copytree(os.path.join(golden, "step0", "rank"), os.path.join(golden, "step0", "rank7"))
    result = compare(golden, target, d / "out", verbose=False)
    _set_diagnosis(result, DIAGNOSIS)
    write_html(result, d / "out" / "report.html")
    return result, d / "out" / "report.html"


def _subtree_keys(page, key):
    return set(page.js(f"""(() => {{ const t = T[unit], i = t.nodes.findIndex(n => n[6] === {key!r});
        return [...subtreeKeys(t, i)]; }})()"""))


def test_headline_shows_the_first_divergence_on_both_sides_and_the_diagnosis(browser, small, tmp_path):
    result, report = small
    fd = result.first_divergence
    assert fd.key == "Functional.gelu.1.forward"           # layers.1's GELU, the bug's place
    page = browser.page(report.as_uri())
    assert page.js("document.getElementById('verdict').textContent") == result.verdict.upper()
    calls = page.js("[...document.querySelectorAll('#first-calls code')].map(e => e.textContent)")
    assert calls == fd.calls.split(" <-> ") == ["Functional.gelu.1.forward", "Functional.gelu.1.forward"]
    head = page.js("document.getElementById('headline').innerText")
    assert fd.tensor in head and fd.source.split(" in ")[0].rsplit(":", 1)[0].split("/")[-1] in head
    # both sides' statistics of the divergent value, read back against the compared row
    row = next(r for r in result.pairs[0].rows if r.name == fd.tensor)
    stats = page.js("[...document.querySelectorAll('#headline table.mini tr')].map(tr => "
                    "[...tr.children].map(td => td.textContent))")
    assert stats[1][0] == "golden" and float(stats[1][1]) == pytest.approx(row.golden_max, rel=1e-4)
    assert stats[2][0] == "target" and float(stats[2][4]) == pytest.approx(row.target_norm, rel=1e-4)
    assert row.golden_max != row.target_max
    # the diagnosis, best first, each with its evidence; the 4th behind "more"
    items = page.js("[...document.querySelectorAll('#diagnosis > ol > li')].map(li => li.innerText)")
    assert len(items) == 3 and items[0].startswith(DIAGNOSIS[0]["title"]) and DIAGNOSIS[0]["evidence"] in items[0]
    assert "92%" in items[0] and "needs tensors" in items[1]
    assert page.js("document.querySelectorAll('#diagnosis details li').length") == 1
    # tolerances are a table, not JSON
    tol = page.js("[...document.querySelectorAll('#tolerances tr')].map(tr => tr.children[0].textContent)")
    assert "float32" in tol and not page.js("document.body.innerText.includes('{\"rtol\"')")
    page.screenshot(tmp_path / "headline.png")
    assert (tmp_path / "headline.png").stat().st_size > 10000
    page.close()


def test_tree_opens_on_the_first_divergence_and_a_click_filters_the_table(browser, small, tmp_path):
    result, report = small
    fd = result.first_divergence
    page = browser.page(report.as_uri())
    tree = page.js("[...document.querySelectorAll('#tree .tn[data-i]')].map(e => [e.className, e.dataset.k, "
                   "e.querySelector('.lb').style.paddingLeft, Math.round(e.getBoundingClientRect().height)])")
    keys = [k for _, k, _, _ in tree]
    first = [t for t in tree if "first" in t[0].split()]
    assert len(first) == 1 and first[0][1] == fd.key and fd.verdict in first[0][0].split()
    chain = ["Module.layers.1.Block.forward.0", "Module.layers.1.act.GELU.forward.0", fd.key]
    assert [keys.index(k) for k in chain] == sorted(keys.index(k) for k in chain)
    depth = {k: p for _, k, p, _ in tree}
    assert depth[fd.key] == "3.3em" and depth["Module.layers.1.act.GELU.forward.0"] == "2.2em"
    cls = {k: c.split() for c, k, _, _ in tree}
    assert fd.verdict in cls["Module.layers.1.Block.forward.0"] and "pass" in cls["Module.layers.0.Block.forward.0"]
    assert "Functional.gelu.2.forward" not in keys                # closed subtrees are not rendered
    line = page.js("parseFloat(getComputedStyle(document.getElementById('tree')).fontSize)")
    assert len({h for *_, h in tree}) == 1 and tree[0][3] <= 2 * line     # every tree row one line
    # the bar of a failing module counts its values by verdict, as the compared rows do
    bar = page.js("document.querySelector('#tree .tn[data-k=\"Module.layers.1.Block.forward.0\"] .bar').title")
    below = [r for r in result.pairs[0].rows if (r.golden_key or "") in _subtree_keys(page, chain[0])]
    assert bar == (f"{sum(r.verdict == 'pass' for r in below)} pass, {sum(r.verdict == 'warning' for r in below)} "
                   f"warning, {sum(r.verdict == 'error' for r in below)} error")

    # click the GELU module: the table shows only the rows of its subtree, in its step/rank
    page.click('#tree .tn[data-k="Module.layers.1.act.GELU.forward.0"]')
    assert "sel" in page.js("document.querySelector('#tree .tn[data-k=\"Module.layers.1.act.GELU.forward.0\"]')"
                            ".className").split()
    names = page.js("[...document.querySelectorAll('#t tr:not(.grp)')].slice(1).map(tr => "
                    "tr.children[[...document.querySelectorAll('#t th')].findIndex(th => th.dataset.c === 'name')]"
                    ".textContent)")
    want = sorted(r.name for r in result.pairs[0].rows
                  if r.golden_key in ("Module.layers.1.act.GELU.forward.0", "Functional.gelu.1.forward"))
    assert sorted(names) == want and len(want) >= 4
    assert "GELU" in page.js("document.getElementById('chip').textContent")
    rows = page.js("[...document.querySelectorAll('#t tr:not(.grp)')].slice(1).map(tr => Math.round(tr.getBoundingClientRect().height))")
    assert len(set(rows)) == 1 and rows[0] <= 2 * line                        # every table row one line
    page.screenshot(tmp_path / "filtered.png")
    page.click("#unsel")                                                     # the chip's x: every row again
    assert page.js("document.getElementById('chip').textContent") == ""
    assert page.js("document.querySelectorAll('#t tr:not(.grp)').length") - 1 == len(result.pairs[0].rows)

    # the step/rank selector: the clean unit has no first divergence
    assert page.js("[...document.getElementById('unit').options].map(o => o.textContent)") == \
        ["step0/rank (diverges)", "step0/rank7"]
    page.js("(() => { const s = document.getElementById('unit'); s.value = '1'; s.dispatchEvent(new Event('change')); })()")
    assert page.js("document.querySelector('#tree .tn.first')") is None
    assert page.js("document.querySelectorAll('#tree .tn').length") > 1
    page.close()


def test_the_chart_draws_only_failing_calls_as_errors(browser, small):
    result, report = small
    page = browser.page(report.as_uri())
    pair = result.pairs[0]
    failing = {r.order for r in pair.rows if r.verdict != "pass" and r.error_measure is not None}
    calls = {r.order for r in pair.rows}
    assert page.js("document.querySelectorAll('#chart circle').length") == len(failing)
    assert page.js("document.querySelectorAll('#chart line[stroke-opacity]').length") == len(calls - failing)
    panels = page.js("[...document.querySelectorAll('#chart text')].map(t => t.textContent)"
                     ".filter(s => s.includes('calls)'))")
    assert [p.split(" ")[0] for p in panels] == ["forward", "backward"]
    assert page.js("document.querySelectorAll('#chart .firstmark').length") == 1
    page.close()


GPT2_STEPS, GPT2_LAYERS = 4, 12


def _gpt2(path, eps_bug: bool) -> str:
    from transformers import GPT2Config, GPT2LMHeadModel

    from ts_core import PrecisionDebugger, seed_all

    seed_all(1234, rm_dropout=True)
    cfg = GPT2Config(n_layer=GPT2_LAYERS, n_embd=32, n_head=2, vocab_size=128, n_positions=32, bos_token_id=0,
                     eos_token_id=0, loss_type="ForCausalLMLoss")
    model = GPT2LMHeadModel(cfg)
    if eps_bug:
        model.transformer.h[5].ln_2.eps = 1e-2
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = torch.randint(0, 128, (2, 16))
    debugger = PrecisionDebugger(dump_path=str(path), task="statistics", level="mix", step=list(range(GPT2_STEPS)))
    for _ in range(GPT2_STEPS):
        debugger.start(model)
        model(input_ids=data, labels=data).loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()
    return str(path)


def test_a_12_layer_gpt2_over_4_steps_renders(browser, tmp_path, record_property):
    result = compare(_gpt2(tmp_path / "g", False), _gpt2(tmp_path / "t", True), tmp_path / "out", verbose=False)
    assert result.first_divergence.module == "Module.transformer.h.5.ln_2.LayerNorm.forward.0"
    page = browser.page((tmp_path / "out" / "report.html").as_uri())
    record_property("render_ms", page.js("window.tsprobeRendered"))
    assert page.js("document.querySelectorAll('#tree .tn.first').length") == 1
    assert page.js("document.querySelectorAll('#chart circle').length") > 0
    # the heat-map: one row per step, one column per block (and embeddings, final norm, head)
    heat = page.js("[...document.querySelectorAll('#heat tr')].map(tr => tr.children.length)")
    assert len(heat) == 1 + GPT2_STEPS and heat[0] - 1 >= GPT2_LAYERS
    assert page.js("[...document.querySelectorAll('#heat th.c')].map(t => t.title)").count("transformer.h.5") == 1
    # a heat-map cell opens its module in the tree, in its step
    col = page.js("[...document.querySelectorAll('#heat th.c')].map(t => t.title)").index("transformer.h.5")
    page.click(f'#heat td[data-u="2"][data-c="{col}"]')
    assert page.js("document.getElementById('unit').value") == "2"
    assert page.js("document.querySelector('#tree .tn.sel').dataset.k") == "Module.transformer.h.5.GPT2Block.forward.0"
    assert page.js("document.getElementById('chip').textContent").startswith("only step2/rank")
    page.js("(() => { const s = document.getElementById('unit'); s.value = '0'; s.dispatchEvent(new Event('change')); })()")
    # statistics mode: both sides' statistics shown, no empty element-wise columns
    cols = page.js("[...document.querySelectorAll('#t th')].map(t => t.dataset.c)")
    assert {"golden_max", "target_max", "golden_norm", "target_norm", "norm_rel_diff"} <= set(cols)
    assert not {"cosine", "max_abs_err", "allclose_ratio", "worst_index", "rtol", "step", "rank"} & set(cols)
    groups = page.js("[...document.querySelectorAll('#t tr.grp')].map(tr => tr.innerText)")
    assert [g.split(" · ")[0].strip("▾▸ ") for g in groups] == [f"step{s}/rank" for s in range(GPT2_STEPS)]
    # layout-only calls (view, to, float ...) are folded inside their module until unfolded
    for k in ("Module.transformer.h.0.GPT2Block.forward.0", "Module.transformer.h.0.attn.GPT2Attention.forward.0"):
        page.click(f'#tree .tn[data-k="{k}"]')
    attn_key = "Module.transformer.h.0.attn.GPT2Attention.forward.0"
    i = page.js(f"T[unit].nodes.findIndex(n => n[6] === '{attn_key}')")
    attn = page.js(f"T[unit].kids[{i}].map(c => [T[unit].nodes[c][6], T[unit].nodes[c][9]])")
    folded = [k for k, f in attn if f]
    assert folded and all(k.split(".")[1] in ("view", "reshape", "to", "float", "contiguous", "transpose", "permute",
                                              "size", "split", "unsqueeze", "expand") for k in folded)

    def shown():
        return set(page.js("[...document.querySelectorAll('#tree .tn[data-i]')].map(e => e.dataset.k)"))

    assert not set(folded) & shown() and {k for k, f in attn if not f} <= shown()
    fold = f'#tree .tn[data-fold="{i}"]'
    assert page.js(f"document.querySelector('{fold} .lb').textContent").startswith(f"{len(folded)} folded")
    page.click(fold)
    assert set(folded) <= shown()
    page.screenshot(tmp_path / "gpt2.png")
    page.close()
