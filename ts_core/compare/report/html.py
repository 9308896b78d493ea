"""report.html: one self-contained file (no network, no CDN).

Top to bottom, in the order a person asks: the headline card (verdict, the first divergence on
both sides ``golden <-> target``, the diagnosis with its evidence, the source line, both sides'
statistics of the divergent value); the golden and target model trees side by side on one line
per call (each node coloured by the worst verdict below it, with a bar of its values by
verdict; layout-only calls and calls one side runs alone folded away); the error along
execution order (forward and backward apart, the first divergence marked, passing calls on a
lane of their own, not drawn as errors); a step x rank x module heat-map when there are several
steps or ranks; then the table, grouped by step/rank, with both sides' statistics and only the
columns the comparison filled. Clicking a tree node filters the table to it. Every tree and
table row is one line high; value names are shown whole (the table scrolls sideways), other long
text is cut with an ellipsis and shown whole on hover. The table opens with the rows that do
not pass first (each part in execution order): the first divergence's neighbours, not step 0's
passing calls."""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from .heatmap import heatmap
from ...verdicts import PASS
from ..model import CompareResult, FirstDivergence, Row, _clean
from .tree import trees

# Table columns in display order; the page shows those the comparison filled. Each side's
# statistics sit next to each other (golden max | target max ...). Tolerances have their own
# table in the header, the step and rank their group rows.
_COLUMNS = ["order", "verdict", "direction", "name", "target_key", "mode", "golden_dtype", "target_dtype",
            "golden_shape", "target_shape", "cosine", "max_abs_err", "mean_abs_err", "max_rel_err",
            "allclose_ratio", "within_0_1pct", "within_0_5pct", "euclidean", "worst_index", "worst_golden",
            "worst_target", "golden_max", "target_max", "golden_min", "target_min", "golden_mean", "target_mean",
            "golden_norm", "target_norm", "max_rel_diff", "min_rel_diff", "mean_rel_diff", "norm_rel_diff",
            "max_diff", "min_diff", "mean_diff", "norm_diff", "md5_equal", "golden_value", "target_value",
            "golden_nan", "target_nan", "golden_inf", "target_inf", "reason"]
_ALWAYS = {"order", "verdict", "direction", "name", "mode", "reason"}
# what the script needs of every row, shown or not (the tree filter, the chart)
_DATA = ["order", "verdict", "direction", "golden_key", "target_key"]
_STATS = ("max", "min", "mean", "norm")

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em 1.5em;color:#1f2328;background:#fff}
h1{font-size:1.35em;margin:.2em 0 .4em} h2{font-size:1.1em;margin:1.3em 0 .4em}
code{font-size:.92em} .muted{color:#656d76} .small{font-size:.85em}
.pass{color:#1a7f37} .warning{color:#9a6700} .error{color:#cf222e}
.badge{display:inline-block;padding:.05em .55em;border-radius:1em;color:#fff;font-size:.85em;vertical-align:middle}
.badge.pass{background:#1a7f37} .badge.warning{background:#bf8700} .badge.error{background:#cf222e}
.card{border:1px solid #d0d7de;border-radius:8px;padding:.8em 1em;margin:.7em 0;background:#f6f8fa}
.card.head{border-left:5px solid #cf222e;background:#fff} .card.head.v-pass{border-left-color:#1a7f37}
.card.head.v-warning{border-left-color:#bf8700}
.calls{font-size:1.05em;margin:.25em 0} .calls code{background:#eef1f4;padding:.1em .35em;border-radius:4px}
.arrow{color:#656d76;margin:0 .4em}
.grid2{display:grid;grid-template-columns:minmax(0,1.4fr) minmax(0,1fr);gap:1em}
table.mini{border-collapse:collapse;font-size:.82em;margin:.3em 0} table.mini td,table.mini th{border:1px solid #d8dee4;
  padding:1px 7px;text-align:right;font-family:monospace} table.mini th{background:#eef1f4;font-family:system-ui}
table.mini td:first-child,table.mini th:first-child{text-align:left;font-family:system-ui}
ol.dx{margin:.3em 0;padding-left:1.4em} ol.dx li{margin:.35em 0}
.conf{display:inline-block;width:5em;height:.55em;background:#e6e9ed;border-radius:3px;vertical-align:middle;margin:0 .4em}
.conf i{display:block;height:100%;background:#8250df;border-radius:3px}
.tag{font-size:.75em;border:1px solid #d0d7de;border-radius:1em;padding:0 .5em;color:#656d76;margin-left:.3em}
.ev{color:#3b4148;font-size:.9em;margin-top:.1em}
.src{font-family:monospace;font-size:.88em;background:#eef1f4;padding:.2em .4em;border-radius:4px;display:inline-block}
#treehead,.tn{display:grid;grid-template-columns:1.2em 1em 3.4em minmax(0,1fr) minmax(0,1fr) 13em;align-items:center;
  column-gap:.35em}
#treehead{font-weight:600;font-size:.8em;color:#656d76;padding:.2em 0;border-bottom:1px solid #d0d7de}
#tree{border:1px solid #d0d7de;background:#fff;max-height:34em;overflow-y:auto;overflow-x:hidden;font-size:.84em;
  font-family:monospace}
.tn{height:1.45em;line-height:1.45em;white-space:nowrap;cursor:pointer;border-bottom:1px solid #f3f4f6}
.tn:hover{background:#f6f8fa} .tn .tg{color:#656d76;text-align:center}
.tn .dot{width:.7em;height:.7em;border-radius:50%}
.tn .lb,.tn .tl{overflow:hidden;text-overflow:ellipsis} .tn .tl{color:#57606a}
.tn .er{text-align:right;padding-right:.5em;overflow:hidden}
.bar{display:flex;height:.55em;border-radius:2px;overflow:hidden;background:#eee}
.bar i{display:block;height:100%} .bar .p{background:#4ac26b} .bar .w{background:#d4a72c} .bar .e{background:#cf222e}
.tn.pass .dot{background:#1a7f37} .tn.warning .dot{background:#d4a72c} .tn.error .dot{background:#cf222e}
.tn.pass,.tn.warning,.tn.error{color:#1f2328} .tn.fold{color:#656d76} .tn.error .er{color:#cf222e} .tn.warning .er{color:#9a6700} .tn.root{font-weight:bold;background:#f6f8fa}
.tn.first{background:#ffebe9;outline:2px solid #cf222e;outline-offset:-2px;font-weight:bold}
.tn.sel{background:#ddf4ff} .tn.fold{color:#656d76;font-style:italic}
#chart{border:1px solid #d0d7de;background:#fff}
#heat table{border-collapse:collapse;font-size:.75em} #heat td{width:1.7em;height:1.3em;border:1px solid #fff;cursor:pointer}
#heat th{font-weight:normal;color:#656d76;white-space:nowrap;padding:0 .4em} #heat th.c{writing-mode:vertical-rl;
  transform:rotate(180deg);height:9em;text-align:left;padding:.2em 0}
.tools{margin:.3em 0} .chip{background:#ddf4ff;border:1px solid #54aeff;border-radius:1em;padding:0 .6em;font-size:.85em}
.chip button{border:0;background:none;cursor:pointer;color:#0969da}
#tablebox{max-height:75vh;overflow:auto;border:1px solid #d0d7de} #t{border-collapse:collapse;font-size:.79em} #t th,#t td{border:1px solid #d8dee4;padding:1px 5px;white-space:nowrap;
  max-width:26em;overflow:hidden;text-overflow:ellipsis} #t td.nm{max-width:none;font-family:monospace;font-size:.95em}
#t th{cursor:pointer;background:#eef1f4;position:sticky;top:0;z-index:1} #t td.num{text-align:right;font-family:monospace}
#t tr.grp td{background:#f6f8fa;font-weight:600;cursor:pointer;border-top:2px solid #d0d7de}
#t tr.pass,#t tr.warning,#t tr.error{color:#1f2328} #t tr.error td{background:#fff8f8} #t tr.error td.v{color:#cf222e;font-weight:bold} #t tr.warning td.v{color:#9a6700} #t tr.pass td.v{color:#1a7f37}
#t td.g{background:#fbfdff} #t td.tg{background:#fffdf7}
"""

_SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const T = D.trees, cols = D.columns, rows = D.rows, shown = D.shown;
const C = Object.fromEntries(cols.map((c,i)=>[c,i]));
// sortCol TRIAGE (the default): the rows that do not pass first, each part in execution order
const TRIAGE = -1;
let unit = D.unit, open = new Set(), unfold = new Set(), sel = null, sortCol = TRIAGE, sortAsc = true;
let openGroups = new Set([D.unit]), LIMIT = 400;   // rows drawn; 'more' draws more (a big table is slow to lay out)
function esc(s){ return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
function fe(v){ return v===null||v===undefined?'':(v==='inf'||v>=1e30?'inf':Number(v).toExponential(2)); }
function kidsOf(t){ if(t.kids) return t.kids; const k={}; t.nodes.forEach((n,i)=>{ if(n[1]>=0) (k[n[1]]=k[n[1]]||[]).push(i); });
  return t.kids=k; }
function bar(b){ const s=b[0]+b[1]+b[2]; if(!s) return '<span></span>';
  return `<span class="bar" title="${b[0]} pass, ${b[1]} warning, ${b[2]} error">`+
    [['p',b[0]],['w',b[1]],['e',b[2]]].map(([c,n])=>n?`<i class="${c}" style="width:${(100*n/s).toFixed(1)}%"></i>`:'').join('')+'</span>'; }
function worst(vs){ return vs.includes('error')?'error':vs.includes('warning')?'warning':'pass'; }
function tree(){ const t=T[unit], box=document.getElementById('tree'); if(!t){ box.textContent='no calls'; return; }
  const kids=kidsOf(t); let h='';
  const line=(i,d)=>{ const n=t.nodes[i], has=!!kids[i], isOpen=open.has(unit+':'+i);
    const cls=['tn',n[3],n[2]==='root'?'root':'',i===t.first?'first':'',sel===i?'sel':''].join(' ');
    const err=n[4]===null?'':fe(n[4])+(n[5]?' · '+n[5]+' failing':'');
    h+=`<div class="${cls}" data-i="${i}" data-k="${esc(n[6]||'')}" title="${esc((n[6]||n[0])+(n[7]&&n[7]!==n[6]?'  <->  '+n[7]:''))}">`+
      `<span class="tg">${has?(isOpen?'&#9662;':'&#9656;'):''}</span><span class="dot"></span>${bar(n[10])}`+
      `<span class="lb" style="padding-left:${(d*1.1).toFixed(1)}em">${esc(n[0]||'·')}</span>`+
      `<span class="tl">${esc(n[8]===n[0]?'=':(n[8]||'·'))}</span><span class="er">${err}</span></div>`;
    if(has&&isOpen) kidsBlock(i,d+1); };
  const kidsBlock=(i,d)=>{ const ks=kids[i], folded=ks.filter(c=>t.nodes[c][9]), fk=unit+':'+i;
    let foldShown=false;
    for(const c of ks){ if(t.nodes[c][9]&&!unfold.has(fk)){ if(!foldShown){ foldShown=true;
        const vs=folded.map(f=>t.nodes[f][3]), names=[...new Set(folded.map(f=>(t.nodes[f][0]||t.nodes[f][8]).split('.').slice(-2,-1)[0]||t.nodes[f][0]))];
        h+=`<div class="tn fold ${worst(vs)}" data-fold="${i}" title="layout-only calls (shape, reshape, view, cast ...) and calls one side runs alone">`+
          `<span class="tg">+</span><span class="dot"></span><span></span><span class="lb" style="padding-left:${(d*1.1).toFixed(1)}em">`+
          `${folded.length} folded: ${esc(names.slice(0,6).join(', '))}${names.length>6?' ...':''}</span><span></span><span></span></div>`; }
        continue; }
      line(c,d); } };
  for(const r of t.roots) line(r,0);
  if(t.hidden) h+=`<div class="tn"><span></span><span></span><span></span><span class="lb">${t.hidden} passing API calls not shown (compare.csv has them)</span></div>`;
  box.innerHTML=h;
  box.querySelectorAll('.tn[data-i]').forEach(el=>el.onclick=()=>{ const i=+el.dataset.i, k=unit+':'+i;
    if(kids[i]){ if(open.has(k)&&sel===i) open.delete(k); else open.add(k); }
    select(t.nodes[i][2]==='root'?null:i); });
  box.querySelectorAll('.tn[data-fold]').forEach(el=>el.onclick=()=>{ unfold.add(unit+':'+el.dataset.fold); tree(); });
  const f=box.querySelector('.tn.first'); if(f&&!t.scrolled){ t.scrolled=true; box.scrollTop=Math.max(0,f.offsetTop-box.offsetTop-80); } }
function select(i){ sel=i; openGroups.add(unit); tree(); table(); }
function subtreeKeys(t,i){ const kids=kidsOf(t), ks=new Set(), st=[i];
  while(st.length){ const j=st.pop(), n=t.nodes[j]; if(n[6]) ks.add(n[6]); if(n[7]) ks.add(n[7]); (kids[j]||[]).forEach(c=>st.push(c)); }
  return ks; }
function openFirst(){ T.forEach((t,u)=>{ t.roots.forEach(r=>{ if(t.nodes[r][3]!=='pass'||t.roots.length===1) open.add(u+':'+r); });
  let i=t.first; while(i!==null&&i!==undefined&&i>=0){ open.add(u+':'+i); i=t.nodes[i][1]; } }); }
function units(){ const s=document.getElementById('unit'); s.innerHTML=T.map((t,u)=>
  `<option value="${u}" ${u===unit?'selected':''}>${esc(t.label)}${t.first!==null?' (diverges)':''}</option>`).join('');
  s.onchange=()=>setUnit(+s.value); }
function setUnit(u){ unit=u; sel=null; openGroups.add(u); document.getElementById('unit').value=String(u); tree(); chart(); table(); }
function err(r){ let e=r[C.error]; return e===null||e===undefined?null:(e==='inf'?1e30:e); }
function calls(u){ const by=new Map(); for(const r of rows){ if(r[C.unit]!==u) continue; const k=r[C.order];
    let c=by.get(k); if(!c){ c={order:k,dir:r[C.direction],v:[],e:null,key:r[C.golden_key]||r[C.target_key]}; by.set(k,c); }
    c.v.push(r[C.verdict]); if(r[C.verdict]!=='pass'){ const e=err(r); if(e!==null&&(c.e===null||e>c.e)) c.e=e; } }
  return [...by.values()].sort((a,b)=>a.order-b.order); }
function chart(){ const svg=document.getElementById('chart'), W=980, H=240, L=44, R=10, top=18, lane=22;
  const cs=calls(unit), fw=cs.filter(c=>c.dir!=='backward'), bw=cs.filter(c=>c.dir==='backward');
  const lo=-8, hi=4, plotH=H-top-lane-26;
  const y=v=>top+(hi-Math.min(hi,Math.max(lo,Math.log10(Math.max(v,1e-8)))))/(hi-lo)*plotH;
  const gap=bw.length&&fw.length?24:0, span=W-L-R-gap, wf=fw.length?(bw.length?span*Math.max(.25,Math.min(.75,fw.length/cs.length)):span):0;
  const panels=[['forward',fw,L,wf],['backward',bw,L+wf+gap,span-wf]];
  let s=''; for(let e=lo;e<=hi;e+=2){ s+=`<line x1="${L}" x2="${W-R}" y1="${y(10**e)}" y2="${y(10**e)}" stroke="#eef1f4"/>`+
     `<text x="4" y="${y(10**e)+4}" font-size="10" fill="#656d76">1e${e}</text>`; }
  const ly=top+plotH+lane/2+4; s+=`<text x="4" y="${ly+3}" font-size="10" fill="#1a7f37">pass</text>`;
  const color={pass:'#1a7f37',warning:'#bf8700',error:'#cf222e'};
  for(const [name,list,x0,w] of panels){ if(!list.length||w<=0) continue;
    const x=i=>x0+(list.length<2?w/2:i/(list.length-1)*w);
    s+=`<rect x="${x0}" y="${top}" width="${w}" height="${plotH+lane}" fill="none" stroke="#d0d7de"/>`+
       `<text x="${x0+4}" y="${top-5}" font-size="11" fill="#57606a">${name} (${list.length} calls)</text>`;
    let path='';
    list.forEach((c,i)=>{ const v=worst(c.v);
      if(v==='pass'||c.e===null){ s+=`<line x1="${x(i)}" x2="${x(i)}" y1="${ly-4}" y2="${ly+4}" stroke="${color[v]}" stroke-opacity=".5"><title>${esc(c.key)}: ${v}</title></line>`; path+=' M'; }
      else { path+=(path.endsWith('M')||!path?' M':' L')+x(i).toFixed(1)+','+y(c.e).toFixed(1);
        s+=`<circle cx="${x(i)}" cy="${y(c.e)}" r="2.6" fill="${color[v]}"><title>${esc(c.key)}: ${v}, ${fe(c.e)}</title></circle>`; } });
    s=`<path d="${path.replace(/ M(?= M| L|$)/g,'').trim()}" fill="none" stroke="#cf222e" stroke-opacity=".25"/>`+s;
    const f=T[unit].first_order, fi=list.findIndex(c=>c.order===f);
    if(fi>=0) s+=`<line class="firstmark" x1="${x(fi)}" x2="${x(fi)}" y1="${top}" y2="${top+plotH+lane}" stroke="#cf222e" stroke-dasharray="4"/>`+
      `<text x="${x(fi)+4}" y="${top+12}" font-size="11" fill="#cf222e">first divergence</text>`; }
  s+=`<text x="${L}" y="${H-4}" font-size="10" fill="#656d76">execution order &#8594;   y: worst error of the call's failing values (max relative error, or a statistic's relative difference; log)</text>`;
  svg.innerHTML=s; }
function heat(){ const box=document.getElementById('heat'); if(!D.heat){ return; }
  const dir=document.getElementById('hd').value, Hm=D.heat, cells=Hm[dir];
  const colr=c=>{ if(!c) return '#f6f8fa'; if(c[0]==='pass') return '#dafbe1';
    const e=c[1]===null?1:(c[1]==='inf'?1e30:c[1]), t=Math.max(0,Math.min(1,(Math.log10(Math.max(e,1e-8))+8)/10));
    return c[0]==='warning'?`hsl(45,90%,${80-30*t}%)`:`hsl(0,75%,${85-45*t}%)`; };
  let h='<table><tr><th></th>'+Hm.columns.map(c=>`<th class="c" title="${esc(c)}">${esc(c.split('.').slice(-2).join('.'))}</th>`).join('')+'</tr>';
  Hm.units.forEach((u,r)=>{ h+=`<tr><th>${esc(u)}</th>`+cells[r].map((c,k)=>`<td data-u="${r}" data-c="${k}" style="background:${colr(c)}" `+
    `title="${esc(u+' · '+Hm.columns[k]+': '+(c?c[0]+(c[1]!==null?' '+fe(c[1]):''):'not recorded'))}"></td>`).join('')+'</tr>'; });
  box.innerHTML=h+'</table>';
  box.querySelectorAll('td').forEach(td=>td.onclick=()=>{ const u=+td.dataset.u, path=Hm.columns[+td.dataset.c];
    setUnit(u); const t=T[u]; const i=t.nodes.findIndex(n=>n[2]==='module'&&n[6]&&n[6].includes('.'+path+'.')&&n[6].includes('.'+dir+'.'));
    if(i>=0){ let p=t.nodes[i][1]; while(p>=0){ open.add(u+':'+p); p=t.nodes[p][1]; } open.add(u+':'+i); select(i); } }); }
function fmt(v){ if(v===null||v===undefined) return ''; if(typeof v==='number') return Number.isInteger(v)?String(v):v.toPrecision(6);
  if(Array.isArray(v)) return JSON.stringify(v); return String(v); }
function table(){ const q=document.getElementById('q').value.toLowerCase(), v=document.getElementById('v').value;
  const keys=sel===null?null:subtreeKeys(T[unit],sel);
  const chip=document.getElementById('chip');
  chip.innerHTML=sel===null?'':`<span class="chip">only ${esc(T[unit].label)} · ${esc(T[unit].nodes[sel][0]||T[unit].nodes[sel][8])} `+
    `<button id="unsel" title="show every row">&#10005;</button></span>`;
  if(sel!==null) document.getElementById('unsel').onclick=()=>select(null);
  const match=r=>(!v||r[C.verdict]===v)&&(keys===null||(r[C.unit]===unit&&(keys.has(r[C.golden_key])||keys.has(r[C.target_key]))))&&
    (!q||shown.some(c=>{ const x=r[C[c]]; return x!==null&&String(x).toLowerCase().includes(q); }));
  const groups=T.map(()=>[]); for(const r of rows) if(match(r)) groups[r[C.unit]].push(r);
  const sc=sortCol, dir=sortAsc?1:-1;
  const cmp=sc===TRIAGE?(a,b)=>((a[C.verdict]==='pass')-(b[C.verdict]==='pass'))||(a[C.order]-b[C.order]):
    (a,b)=>{ let x=a[sc], y=b[sc]; if(x===y) return 0; if(x===null) return 1; if(y===null) return -1; return (x<y?-1:1)*dir; };
  const mark=c=>sc===TRIAGE?(c==='verdict'?' <span class="muted" title="the rows that do not pass first, in execution order; click a column to sort by it">(not pass first)</span>':''):
    (C[c]===sortCol?(sortAsc?' &#9650;':' &#9660;'):'');
  let h='<tr>'+shown.map(c=>`<th data-c="${c}">${esc(c.replace(/_/g,' '))}${mark(c)}</th>`).join('')+'</tr>';
  let total=0, drawn=0;
  groups.forEach((g,u)=>{ if(!g.length) return; total+=g.length; g.sort(cmp);
    const ne=g.filter(r=>r[C.verdict]==='error').length, nw=g.filter(r=>r[C.verdict]==='warning').length, isOpen=openGroups.has(u);
    h+=`<tr class="grp" data-u="${u}"><td colspan="${shown.length}">${isOpen?'&#9662;':'&#9656;'} ${esc(T[u].label)} · ${g.length} values`+
       `${ne?` · <span class="error">${ne} error</span>`:''}${nw?` · <span class="warning">${nw} warning</span>`:''}</td></tr>`;
    if(!isOpen) return;
    for(const r of g){ if(drawn>=LIMIT) break; drawn++;
      h+=`<tr class="${r[C.verdict]}">`+shown.map(c=>{ const x=r[C[c]], s=c==='target_key'&&x===r[C.golden_key]?'=':esc(fmt(x));
        const cl=[typeof x==='number'?'num':'', c==='verdict'?'v':'', c==='name'||c==='target_key'?'nm':'',
                  c.startsWith('golden_')?'g':c.startsWith('target_')?'tg':''].join(' ');
        return `<td class="${cl}" title="${s}">${s}</td>`; }).join('')+'</tr>'; } });
  document.getElementById('n').innerHTML=`${total} rows`+(drawn>=LIMIT?` (${LIMIT} drawn: filter, or <button id="more">draw 2000 more</button>)`:'');
  if(drawn>=LIMIT) document.getElementById('more').onclick=()=>{ LIMIT+=2000; table(); };
  const t=document.getElementById('t'); t.innerHTML=h;
  t.querySelectorAll('th').forEach(th=>th.onclick=()=>{ const i=C[th.dataset.c]; sortAsc=(i===sortCol)?!sortAsc:true; sortCol=i; table(); });
  t.querySelectorAll('tr.grp').forEach(tr=>tr.onclick=()=>{ const u=+tr.dataset.u; if(openGroups.has(u)) openGroups.delete(u); else openGroups.add(u); table(); }); }
document.getElementById('q').oninput=table; document.getElementById('v').onchange=table;
if(D.heat) document.getElementById('hd').onchange=heat;
openFirst(); units(); tree(); chart(); heat(); table();
window.tsprobeRendered = Date.now() - performance.timing.navigationStart;   // ms, for tests to report
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


def _where(step: Optional[int], rank: str) -> str:
    return "/".join(x for x in (f"step{step}" if step is not None else "", rank) if x) or "dump"


def _num(v: Any, spec: str = ".6g") -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return format(v, spec)
    return html.escape(str(v))


def stats_table(row: Optional[Row]) -> str:
    """Both sides' Max/Min/Mean/Norm of one value (and the relative difference of each)."""
    if row is None or all(getattr(row, f"{s}_{k}") is None for s in ("golden", "target") for k in _STATS):
        return ""
    head = "".join(f"<th>{k.capitalize()}</th>" for k in _STATS)
    lines = [f"<tr><td>{side}</td>" + "".join(f"<td>{_num(getattr(row, f'{side}_{k}'), '.5g')}</td>" for k in _STATS) + "</tr>"
             for side in ("golden", "target")]
    lines.append("<tr><td>relative diff</td>" + "".join(f"<td>{_num(getattr(row, f'{k}_rel_diff'), '.3g')}</td>" for k in _STATS)
                 + "</tr>")
    return (f"<div class='small muted' title='{html.escape(row.name)}'>statistics of {html.escape(row.arg or row.name)}"
            f"</div><table class='mini'><tr><th></th>{head}</tr>{''.join(lines)}</table>")


def diagnosis_html(diagnosis: List[Dict[str, Any]], shown: int = 3) -> str:
    """The ranked cause hypotheses (explain/diagnosis.py), the first `shown` open, each with its
    confidence, evidence and whether it needs full tensors to be checked."""
    if not diagnosis:
        return ""
    esc = html.escape

    def item(h: Dict[str, Any]) -> str:
        conf = float(h.get("confidence") or 0.0)
        needs = "<span class='tag'>needs tensors</span>" if h.get("needs_tensors") else ""
        return (f"<li class='dx'><b>{esc(str(h.get('title', h.get('cause', ''))))}</b>"
                f"<span class='conf' title='confidence {conf:.2f}'><i style='width:{100 * max(0.0, min(1.0, conf)):.0f}%'>"
                f"</i></span><span class='small muted'>{conf:.0%}</span><span class='tag'>{esc(str(h.get('cause', '')))}</span>"
                f"{needs}<div class='ev'>{esc(str(h.get('evidence', '')))}</div></li>")

    top = "".join(item(h) for h in diagnosis[:shown])
    more = "".join(item(h) for h in diagnosis[shown:])
    more = (f"<details><summary class='small'>{len(diagnosis) - shown} more hypotheses</summary>"
            f"<ol class='dx' start='{shown + 1}'>{more}</ol></details>") if more else ""
    return f"<div id='diagnosis'><b>Why (diagnosis, most likely first)</b><ol class='dx'>{top}</ol>{more}</div>"


def tolerance_table(tolerances: Dict[str, Any]) -> str:
    """The tolerances by dtype as a small table (rtol, atol, stat_rtol); other settings listed."""
    esc = html.escape
    by_dtype = {k: v for k, v in tolerances.items() if isinstance(v, dict)}
    other = {k: v for k, v in tolerances.items() if not isinstance(v, dict)}
    keys = list(dict.fromkeys(k for v in by_dtype.values() for k in v))
    out = ""
    if by_dtype:
        out += ("<table class='mini' id='tolerances'><tr><th>dtype</th>" + "".join(f"<th>{esc(k)}</th>" for k in keys)
                + "</tr>" + "".join(f"<tr><td>{esc(d)}</td>" + "".join(f"<td>{_num(v.get(k))}</td>" for k in keys)
                                   + "</tr>" for d, v in by_dtype.items()) + "</table>")
    if other:
        out += "<div class='small'>" + ", ".join(f"{esc(k)}: <code>{esc(json.dumps(v))}</code>"
                                                 for k, v in other.items()) + "</div>"
    return out


def _first_row(result: CompareResult, fd: FirstDivergence) -> Optional[Row]:
    for p in result.pairs:
        if p.step == fd.step and p.rank == fd.rank:
            for r in p.rows:
                if r.name == fd.tensor:
                    return r
    return None


def headline(result: CompareResult) -> str:
    """The card on top: verdict, first divergence on both sides, diagnosis, source line."""
    esc = html.escape
    fd = result.first_divergence
    diagnosis = list(getattr(result, "diagnosis", None) or [])
    boxes = []
    for p in result.different_programs:
        boxes.append(f"<div class='card'><b class='error'>Different programs</b> ({esc(_where(p.step, p.rank))}): "
                     f"{esc(p.programs.get('evidence', ''))}</div>")
    if fd:
        golden, target = fd.calls.split(" <-> ")
        calls = (f"<div class='calls' id='first-calls' title='{esc(fd.calls)}'><code>{esc(golden)}</code>"
                 f"<span class='arrow'>&#8596;</span>"
                 f"<code>{esc(target)}</code></div>")
        where = f"{esc(_where(fd.step, fd.rank))} · {esc(fd.direction)}" + (
            f" · in <code>{esc(fd.module)}</code>" if fd.module else "")
        src = f"<div>source: <span class='src'>{esc(fd.source)}</span></div>" if fd.source else ""
        stack = (f"<details><summary class='small'>stack</summary><pre class='small'>{esc(chr(10).join(fd.stack))}</pre>"
                 f"</details>") if fd.stack else ""
        body = (f"<div><b>First divergence</b> <span class='small muted'>{where}</span></div>{calls}"
                f"<div><code>{esc(fd.tensor)}</code>: <b class='{esc(fd.verdict)}'>{esc(fd.verdict)}</b> "
                f"- {esc(fd.reason)}</div><div class='small muted'>{esc(fd.cause)}</div>{src}{stack}")
        right = stats_table(_first_row(result, fd))
        boxes.append(f"<div class='card head v-{esc(fd.verdict)}' id='headline'><div class='grid2'><div>{body}</div>"
                     f"<div>{right}</div></div>{diagnosis_html(diagnosis)}</div>")
    else:
        note = result.summary().get("first_divergence_note") or "no call introduced an error"
        boxes.append(f"<div class='card head v-{esc(result.verdict)}' id='headline'>{esc(note)}"
                     f"{diagnosis_html(diagnosis)}</div>")
    for step in result.ranks.get("steps", []):
        boxes.append(f"<div class='card'><b>Ranks:</b> {esc(step['explanation'])}</div>")
    return "".join(boxes)


def _cell(v: Any) -> Any:
    """A table cell for JSON: most are None, text or a finite float (json_safe only when not)."""
    if v is None or type(v) in (str, int, bool) or (type(v) is float and math.isfinite(v)):
        return v
    return _clean(v)


def page_data(result: CompareResult, max_rows: int = 20000) -> Dict[str, Any]:
    """What the page's script draws: the trees, the rows (with their step/rank unit), the
    columns to show (those the comparison filled), the heat-map."""
    unit_of = {id(p): u for u, p in enumerate(result.pairs)}
    all_rows = [(unit_of[id(p)], r) for p in result.pairs for r in p.rows]
    kept_ids = {id(r) for r in _select_rows([r for _, r in all_rows], max_rows)}
    kept = [(u, r) for u, r in all_rows if id(r) in kept_ids]
    empty = set(_COLUMNS) - _ALWAYS
    for _, r in kept:
        if not empty:
            break
        empty = {c for c in empty if getattr(r, c) is None}
    if all(r.target_key in (None, r.golden_key) for _, r in kept):
        empty.add("target_key")            # same keys on both sides: the column repeats `name`
    shown = [c for c in _COLUMNS if c not in empty]
    data_cols = list(dict.fromkeys(shown + _DATA))
    rows = [[_cell(getattr(r, c)) for c in data_cols] + [u, _cell(r.error_measure)] for u, r in kept]
    tree_data = _clean(trees(result.pairs))
    fd = result.first_divergence
    for t, p in zip(tree_data, result.pairs):
        f = p.first_divergence
        t["first_order"] = next((r.order for r in p.rows if f and r.name == f.tensor), None)
    unit = next((i for i, p in enumerate(result.pairs) if fd is not None and p.first_divergence is fd), 0)
    return {"columns": data_cols + ["unit", "error"], "shown": shown, "rows": rows, "trees": tree_data,
            "unit": unit, "heat": _clean(heatmap(tree_data)), "total_rows": len(all_rows)}


def write_html(result: CompareResult, path: Path, max_rows: int = 20000) -> None:
    esc = html.escape
    data = page_data(result, max_rows)
    c = result.counts
    counts = (f"{c.get('matched', 0)} calls matched, {c.get('unmatched_golden', 0)} only in golden, "
              f"{c.get('unmatched_target', 0)} only in target · values: <span class='pass'>{c.get('pass', 0)} pass</span>, "
              f"<span class='warning'>{c.get('warning', 0)} warning</span>, <span class='error'>{c.get('error', 0)} error</span>")
    sampled = "" if len(data["rows"]) == data["total_rows"] else (
        f"<p class='small'>The page holds {len(data['rows'])} of {data['total_rows']} values (every non-passing one, "
        f"passing ones sampled); compare.csv has them all.</p>")
    heat = ("<h2>Step &times; rank &times; module</h2><div class='small muted'>worst verdict and error of each module "
            "(columns) in each step/rank (rows); click a cell to open it in the tree "
            "<select id='hd'><option>forward</option><option>backward</option></select></div><div id='heat'></div>"
            ) if data["heat"] else ""
    payload = json.dumps(data).replace("</", "<\\/")
    doc = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>tsprobe compare: {esc(result.verdict)}</title>
<style>{_STYLE}</style></head><body>
<h1>tsprobe compare <span class="badge {esc(result.verdict)}" id="verdict">{esc(result.verdict.upper())}</span></h1>
<div class="small">{counts}</div>
{headline(result)}
<details class="small"><summary>golden <code>{esc(result.golden)}</code> &#8596; target <code>{esc(result.target)}</code>
 · tolerances</summary>{tolerance_table(result.tolerances)}</details>
<h2>Model tree</h2>
<div class="small muted">step/rank <select id="unit"></select> · golden (left) and target (right) on one line per call
(<code>=</code>: the same name); colour: the worst verdict below; bar: the values below by verdict; layout-only calls and
calls one side runs alone are folded (click to unfold); click a node to open it and filter the table to it</div>
<div id="treehead"><span></span><span></span><span></span><span>golden</span><span>target</span>
<span style="text-align:right;padding-right:.5em">worst error</span></div>
<div id="tree"></div>
<h2>Error along execution order</h2><svg id="chart" width="980" height="240"></svg>
{heat}
<h2>Values</h2>{sampled}<div class="tools">filter <input id="q" size="36" placeholder="text in any shown column">
<select id="v"><option value="">all verdicts</option><option>error</option><option>warning</option><option>pass</option></select>
<span id="chip"></span> <span id="n" class="small muted"></span></div>
<div id="tablebox"><table id="t"></table></div>
<script type="application/json" id="data">{payload}</script>
<script>{_SCRIPT}</script></body></html>"""
    path.write_text(doc, encoding="utf-8")
