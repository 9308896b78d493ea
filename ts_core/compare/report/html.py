"""report.html: one self-contained file (no network): verdict and first divergence on top, the
model tree (module hierarchy with each module's worst error, the first divergence opened and
highlighted, a step/rank selector), error along execution order as a chart, then a sortable and
filterable table. Every tree and table row is one line high; long text is cut with an ellipsis
and shown whole on hover."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import List

from ...verdicts import PASS
from ..model import CompareResult, Row, _clean
from .tree import trees

_COLUMNS = ["order", "verdict", "direction", "name", "target_key", "mode", "golden_dtype", "target_dtype",
            "golden_shape", "target_shape", "cosine", "max_abs_err", "mean_abs_err", "max_rel_err",
            "allclose_ratio", "within_0_1pct", "within_0_5pct", "euclidean", "max_rel_diff", "min_rel_diff",
            "mean_rel_diff", "norm_rel_diff", "worst_index", "worst_golden", "worst_target", "rtol", "atol",
            "step", "rank", "reason"]

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} .pass{color:#1a7f37} .warning{color:#9a6700} .error{color:#cf222e}
.box{border:1px solid #ccc;border-radius:6px;padding:.8em 1em;margin:.8em 0;background:#fafafa}
pre{white-space:pre-wrap;font-size:.85em;margin:.3em 0}
table{border-collapse:collapse;font-size:.8em} th,td{border:1px solid #ddd;padding:2px 5px;white-space:nowrap;
  max-width:28em;overflow:hidden;text-overflow:ellipsis}
th{cursor:pointer;background:#f0f0f0;position:sticky;top:0} td.num{text-align:right;font-family:monospace}
#tree{border:1px solid #ddd;background:#fff;max-height:36em;overflow-y:auto;overflow-x:hidden;font-size:.85em;font-family:monospace}
.tn{display:flex;align-items:center;height:1.45em;line-height:1.45em;white-space:nowrap;cursor:pointer;
  border-bottom:1px solid #f3f3f3}
.tn:hover{background:#f6f8fa} .tn .tg{width:1.1em;flex:none;color:#666;text-align:center}
.tn .dot{width:.7em;height:.7em;border-radius:50%;flex:none;margin-right:.45em}
.tn .lb{flex:1 1 auto;overflow:hidden;text-overflow:ellipsis} .tn .er{flex:none;width:15em;text-align:right;padding-right:.6em}
.tn.pass .dot{background:#1a7f37} .tn.warning .dot{background:#d4a72c} .tn.error .dot{background:#cf222e}
.tn.error .er{color:#cf222e} .tn.warning .er{color:#9a6700} .tn.root{font-weight:bold;background:#f6f6f6}
.tn.first{background:#ffebe9;outline:2px solid #cf222e;outline-offset:-2px;font-weight:bold}
tr.error td:nth-child(2){color:#cf222e;font-weight:bold} tr.warning td:nth-child(2){color:#9a6700}
#chart{border:1px solid #ddd;background:#fff}
"""

_SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const T = JSON.parse(document.getElementById('trees').textContent);
let open = new Set(), unit = T.unit;
function fe(v){ return v===null||v===undefined?'':(v==='inf'?'inf':Number(v).toExponential(2)); }
function tree(){ const t=T.trees[unit], box=document.getElementById('tree'); if(!t){ box.textContent='no calls'; return; }
  const kids={}; t.nodes.forEach((n,i)=>{ if(n[1]>=0) (kids[n[1]]=kids[n[1]]||[]).push(i); });
  let h=''; const walk=(i,d)=>{ const n=t.nodes[i], has=!!kids[i], isOpen=open.has(unit+':'+i);
    const cls=['tn',n[3],n[2]==='root'?'root':'',i===t.first?'first':''].join(' ');
    const err=n[4]===null?'':'worst '+fe(n[4])+(n[5]?' · '+n[5]+' failing':'');
    h+=`<div class="${cls}" data-i="${i}" title="${esc(n[6]||n[0])}" style="padding-left:${(d*1.1).toFixed(1)}em">`+
      `<span class="tg">${has?(isOpen?'&#9662;':'&#9656;'):''}</span><span class="dot"></span>`+
      `<span class="lb">${esc(n[0])}</span><span class="er">${err}</span></div>`;
    if(has&&isOpen) for(const c of kids[i]) walk(c,d+1); };
  for(const r of t.roots) walk(r,0);
  if(t.hidden) h+=`<div class="tn">${t.hidden} passing API calls not shown (compare.csv has them)</div>`;
  box.innerHTML=h;
  box.querySelectorAll('.tn').forEach(el=>el.onclick=()=>{ const k=unit+':'+el.dataset.i;
    if(open.has(k)) open.delete(k); else open.add(k); tree(); });
  const f=box.querySelector('.tn.first'); if(f&&!T.scrolled){ T.scrolled=true; box.scrollTop=Math.max(0,f.offsetTop-box.offsetTop-60); } }
function openFirst(){ T.trees.forEach((t,u)=>{ t.roots.forEach(r=>{ if(t.nodes[r][3]!=='pass'||t.roots.length===1) open.add(u+':'+r); });
  let i=t.first; while(i!==null&&i!==undefined&&i>=0){ open.add(u+':'+i); i=t.nodes[i][1]; } }); }
function units(){ const s=document.getElementById('unit'); s.innerHTML=T.trees.map((t,u)=>
  `<option value="${u}" ${u===unit?'selected':''}>${esc(t.label)}${t.first!==null?' (diverges)':''}</option>`).join('');
  s.onchange=()=>{ unit=+s.value; T.scrolled=false; tree(); chart(); table(); }; }
const cols = D.columns, rows = D.rows;
const si=cols.indexOf('step'), ri=cols.indexOf('rank');
function label(r){ return [r[si]===null?'':'step'+r[si], r[ri]||''].filter(x=>x).join('/')||'dump'; }
let sortCol = 0, sortAsc = true;
function fmt(v){ if(v===null||v===undefined) return ''; if(typeof v==='number') return Number.isInteger(v)?String(v):v.toPrecision(6);
  if(Array.isArray(v)) return JSON.stringify(v); return String(v); }
function err(r){ const c=cols; let e=r[c.indexOf('max_rel_err')];
  if(e===null||e===undefined){ e=Math.max(...['max_rel_diff','min_rel_diff','mean_rel_diff','norm_rel_diff']
     .map(k=>r[c.indexOf(k)]).map(v=>typeof v==='number'?v:(v==='inf'?1e30:-1))); if(e<0) return null; }
  if(e==='inf') e=1e30; return typeof e==='number'?e:null; }
function unitRows(){ const lab=T.trees.length>1&&T.trees[unit]?T.trees[unit].label:null;
  return lab===null?rows:rows.filter(r=>label(r)===lab); }
function chart(){ const svg=document.getElementById('chart'), W=980, H=220, P=40, rows=unitRows();
  const pts=rows.map((r,i)=>[i,err(r),r[cols.indexOf('verdict')]]).filter(p=>p[1]!==null);
  let s=''; const lo=-12, hi=6, y=v=>H-P/2-(Math.min(hi,Math.max(lo,Math.log10(Math.max(v,1e-12))))-lo)/(hi-lo)*(H-P);
  const x=i=>P+i/Math.max(1,rows.length-1)*(W-P-10);
  for(let e=lo;e<=hi;e+=3){ s+=`<line x1="${P}" x2="${W-10}" y1="${y(10**e)}" y2="${y(10**e)}" stroke="#eee"/>`+
     `<text x="2" y="${y(10**e)+4}" font-size="10">1e${e}</text>`; }
  const color={pass:'#1a7f37',warning:'#bf8700',error:'#cf222e'};
  for(const p of pts){ s+=`<circle cx="${x(p[0])}" cy="${y(p[1])}" r="2" fill="${color[p[2]]||'#888'}"/>`; }
  if(D.first_order!==null&&(T.trees.length<2||T.trees[unit].label===D.first_label)){ const i=rows.findIndex(r=>r[0]===D.first_order);
    if(i>=0) s+=`<line x1="${x(i)}" x2="${x(i)}" y1="5" y2="${H-5}" stroke="#cf222e" stroke-dasharray="4"/>`+
      `<text x="${x(i)+4}" y="14" font-size="11" fill="#cf222e">first divergence</text>`; }
  s+=`<text x="${P}" y="${H-2}" font-size="10">execution order (forward, then backward) &#8594;  y: max relative error (log)</text>`;
  svg.innerHTML=s; }
function table(){ const q=document.getElementById('q').value.toLowerCase(), v=document.getElementById('v').value;
  const only=document.getElementById('only').checked&&T.trees[unit]?T.trees[unit].label:null;
  let rs=rows.filter(r=>(!v||r[1]===v)&&(!only||label(r)===only)&&(!q||r.some(x=>x!==null&&String(x).toLowerCase().includes(q))));
  rs.sort((a,b)=>{ let x=a[sortCol], y=b[sortCol]; if(x===y) return 0; if(x===null) return 1; if(y===null) return -1;
    return (x<y?-1:1)*(sortAsc?1:-1); });
  const shown=rs.slice(0,2000);
  document.getElementById('n').textContent=`${rs.length} rows`+(rs.length>shown.length?` (first ${shown.length} shown)`:'');
  let h='<tr>'+cols.map((c,i)=>`<th data-i="${i}">${c}${i===sortCol?(sortAsc?' &#9650;':' &#9660;'):''}</th>`).join('')+'</tr>';
  for(const r of shown){ h+=`<tr class="${r[1]}">`+r.map(x=>{ const s=esc(fmt(x));
    return `<td class="${typeof x==='number'?'num':''}" title="${s}">${s}</td>`; }).join('')+'</tr>'; }
  const t=document.getElementById('t'); t.innerHTML=h;
  t.querySelectorAll('th').forEach(th=>th.onclick=()=>{ const i=+th.dataset.i; sortAsc=(i===sortCol)?!sortAsc:true; sortCol=i; table(); }); }
function esc(s){ return s.replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
document.getElementById('q').oninput=table; document.getElementById('v').onchange=table;
document.getElementById('only').onchange=table;
openFirst(); units(); tree(); chart(); table();
"""


def _select_rows(rows: List[Row], max_rows: int) -> List[Row]:
    """Keep a browser-sized table: all non-passing rows first, then evenly spaced passing ones."""
    if len(rows) <= max_rows:
        return rows
    bad = [i for i, r in enumerate(rows) if r.verdict != PASS][:max_rows]
    good = [i for i, r in enumerate(rows) if r.verdict == PASS]
    room = max_rows - len(bad)
    step = len(good) / room if room > 0 else 0
    sampled = [good[int(k * step)] for k in range(room)] if room > 0 else []
    return [rows[i] for i in sorted(bad + sampled)]


def write_html(result: CompareResult, path: Path, max_rows: int = 20000) -> None:
    fd = result.first_divergence
    esc = html.escape
    if fd:
        where = "/".join(x for x in (f"step{fd.step}" if fd.step is not None else "", fd.rank) if x)
        head = (f"<div class='box'><b class='error'>First divergence:</b> <code>{esc(fd.calls)}</code> "
                f"[{esc(fd.direction)}]{' in <code>' + esc(fd.module) + '</code>' if fd.module else ''}"
                f"{' on ' + esc(where) if where else ''}<br>"
                f"<code>{esc(fd.tensor)}</code>: <b class='{esc(fd.verdict)}'>{esc(fd.verdict)}</b> - {esc(fd.reason)}<br>"
                f"cause: {esc(fd.cause)}"
                + (f"<br>source: <code>{esc(fd.source)}</code>" if fd.source else "")
                + (f"<details><summary>stack</summary><pre>{esc(chr(10).join(fd.stack))}</pre></details>"
                   if fd.stack else "") + "</div>")
    else:
        head = f"<div class='box'>{esc(result.summary().get('first_divergence_note') or 'no divergence')}</div>"
    for p in result.different_programs:
        head = f"<div class='box'><b class='error'>Different programs:</b> {esc(p.programs['evidence'])}</div>" + head
    for step in result.ranks.get("steps", []):
        head += f"<div class='box'><b>Ranks:</b> {esc(step['explanation'])}</div>"
    c = result.counts
    counts = ", ".join(f"{k}: {v}" for k, v in c.items())
    kept = _select_rows(result.rows, max_rows)
    shown = "" if len(kept) == len(result.rows) else (
        f"<p>Showing {len(kept)} of {len(result.rows)} rows (every non-passing row, passing ones sampled); "
        f"compare.csv has them all.</p>")
    rows = [[_clean(getattr(r, col)) for col in _COLUMNS] for r in kept]
    data = {"columns": _COLUMNS, "rows": rows, "first_order": None,
            "first_label": "/".join(x for x in (f"step{fd.step}" if fd.step is not None else "", fd.rank) if x) or "dump"
            if fd else None}
    if fd:
        for r in result.rows:
            if r.name == fd.tensor and r.step == fd.step and r.rank == fd.rank:
                data["first_order"] = r.order
                break
    payload = json.dumps(data).replace("</", "<\\/")
    tree_data = trees(result.pairs)
    unit = next((i for i, p in enumerate(result.pairs) if fd is not None and p.first_divergence is fd), 0)
    tree_payload = json.dumps(_clean({"trees": tree_data, "unit": unit})).replace("</", "<\\/")
    doc = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>tsprobe compare</title>
<style>{_STYLE}</style></head><body>
<h1>tsprobe compare: <span class="{result.verdict}">{result.verdict.upper()}</span></h1>
{head}
<div>golden: <code>{esc(result.golden)}</code><br>target: <code>{esc(result.target)}</code><br>{esc(counts)}<br>
tolerances: <code>{esc(json.dumps(result.tolerances))}</code></div>
<h2>Model tree</h2>
<div>step/rank <select id="unit"></select> &nbsp;each node: its worst verdict (colour) and worst error
(max relative error, or a statistic's relative difference) over everything below it; click to open or close</div>
<div id="tree"></div>
<h2>Error along execution order</h2><svg id="chart" width="980" height="220"></svg>
<h2>Rows</h2>{shown}<div>filter <input id="q" size="40" placeholder="text in any column">
<select id="v"><option value="">all verdicts</option><option>error</option><option>warning</option><option>pass</option></select>
<label><input type="checkbox" id="only"> only the step/rank shown in the tree</label>
<span id="n"></span></div>
<table id="t"></table>
<script type="application/json" id="data">{payload}</script>
<script type="application/json" id="trees">{tree_payload}</script>
<script>{_SCRIPT}</script></body></html>"""
    path.write_text(doc, encoding="utf-8")
