"""report.html's model tree in a real headless browser (Debian's chromium): the page is loaded,
its scripts run, the DOM is read back. A copy of the page gets a measuring script appended (row
heights at a 1400-px window, the step/rank selector switched), the report itself is untouched.
A screenshot is written next to the report in the test's temporary folder (never into git)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

torch = pytest.importorskip("torch")

from ts_core.compare import compare  # noqa: E402

from compare_models import dump_mix as dump  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; `make test` installs it)")]

MEASURE = """<script>
(function(){
  const h = sel => [...document.querySelectorAll(sel)].map(e => Math.round(e.getBoundingClientRect().height));
  const m = {width: window.innerWidth, tree: h('#tree .tn'), table: h('#t tr').slice(0, 60),
             line: parseFloat(getComputedStyle(document.querySelector('#tree')).fontSize)};
  const s = document.getElementById('unit');
  m.units = [...s.options].map(o => o.textContent); m.selected = s.value;
  s.value = String((+s.value + 1) % s.options.length); s.dispatchEvent(new Event('change'));
  m.after = {selected: s.value, first: !!document.querySelector('#tree .tn.first'),
             rows: document.querySelectorAll('#tree .tn').length};
  const pre = document.createElement('pre'); pre.id = 'measure'; pre.textContent = JSON.stringify(m);
  document.body.appendChild(pre);
})();
</script>"""


def chromium(*args: str) -> str:
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1800", *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


class TreeRows(HTMLParser):
    """The rendered tree rows: (classes, title, padding) of every ``div.tn``, and #measure's text."""

    def __init__(self):
        super().__init__()
        self.rows, self.measure, self._in_measure = [], None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "tn" in (a.get("class") or "").split():
            self.rows.append((a["class"].split(), a.get("title"), a.get("style", "")))
        if tag == "pre" and a.get("id") == "measure":
            self._in_measure = True

    def handle_data(self, data):
        if self._in_measure:
            self.measure = json.loads(data)
            self._in_measure = False


def test_tree_opens_and_highlights_the_first_divergence(tmp_path):
    golden = dump(tmp_path / "golden")
    target = dump(tmp_path / "target", bug={"approximate": "tanh"})
    # two step/rank units on each side: "rank" (the bug) and "rank7" (a copy of golden: clean)
    shutil.copytree(os.path.join(golden, "step0", "rank"), os.path.join(target, "step0", "rank7"))
    shutil.copytree(os.path.join(golden, "step0", "rank"), os.path.join(golden, "step0", "rank7"))
    result = compare(golden, target, tmp_path / "out", verbose=False)
    fd = result.first_divergence
    assert fd.key == "Functional.gelu.1.forward"           # layers.1's GELU, the bug's place

    report = tmp_path / "out" / "report.html"
    rows = TreeRows()
    rows.feed(chromium("--dump-dom", report.as_uri()))
    titles = [t for _, t, _ in rows.rows]
    first = [r for r in rows.rows if "first" in r[0]]
    assert len(first) == 1 and first[0][1] == fd.key and fd.verdict in first[0][0]
    # its ancestors are open above it: forward root > layers.1 (Block) > layers.1.act (GELU) > the call
    chain = ["Module.layers.1.Block.forward.0", "Module.layers.1.act.GELU.forward.0", fd.key]
    assert [titles.index(k) for k in chain] == sorted(titles.index(k) for k in chain)
    depth = {t: s for _, t, s in rows.rows}
    assert depth[fd.key] == "padding-left:3.3em" and depth["Module.layers.1.act.GELU.forward.0"] == "padding-left:2.2em"
    # the modules above it carry its error; a clean sibling block does not
    cls = {t: c for c, t, _ in rows.rows}
    assert fd.verdict in cls["Module.layers.1.Block.forward.0"] and "pass" in cls["Module.layers.0.Block.forward.0"]
    assert "Functional.gelu.2.forward" not in titles         # closed subtrees are not rendered

    probe = tmp_path / "out" / "probe.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    measured = TreeRows()
    measured.feed(chromium("--dump-dom", probe.as_uri()))
    m = measured.measure
    assert m["width"] == 1400
    assert len(set(m["tree"])) == 1 and m["tree"][0] <= 2 * m["line"]        # every tree row one line
    assert len(set(m["table"][1:])) == 1 and m["table"][1] <= 2 * m["line"]  # every table row one line
    assert m["units"] == ["step0/rank (diverges)", "step0/rank7"] and m["selected"] == "0"
    assert m["after"] == {"selected": "1", "first": False, "rows": m["after"]["rows"]} and m["after"]["rows"] > 1

    shot = tmp_path / "out" / "report.png"
    chromium(f"--screenshot={shot}", report.as_uri())
    assert shot.stat().st_size > 10000

