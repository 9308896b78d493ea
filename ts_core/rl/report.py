"""The rl-check report: terminal text, report.json, tokens.csv, stages.csv and report.html (with
inline SVG charts: |dlogp| per token against the band, and each stage's difference against its
band on a log scale). No third-party plotting: the charts are a few SVG elements."""
from __future__ import annotations

import csv
import html
import math
import os
from typing import Any, Dict, List

from ts_core.dumpfmt import write_json_atomic


def text(report: Dict[str, Any]) -> str:
    """What ``tsprobe rl-check`` prints."""
    v, lp, w = report["verdict"], report["logprobs"], report["weights"]
    lines = [f"rl-check: {v['status']}" + (f" ({v['cause']})" if v["cause"] else "") + f": {v['message']}",
             f"log-probs ({lp['mode']}): {lp['tokens']} tokens, max |dlogp| {lp['max_abs']:.3g}, mean "
             f"{lp['mean_abs']:.3g}, KL(k3) {lp['kl_k3']:.3g}, band {lp['band']:.3g}",
             f"weights: {w['checked']} parameters checked, {len(w['differ'])} differ "
             f"(trainer {w['trainer_dtype']}, engine {w['engine_dtype']})"]
    for f in report["findings"]:
        lines.append(f"  [{f['kind']}] {f['message']}")
    if lp["worst"]:
        lines.append("worst tokens:")
        lines.append(f"  {'req':>3} {'pos':>4} {'token':<14} {'logp_rollout':>12} {'logp_train':>12} {'dlogp':>10}")
        for r in lp["worst"][:5]:
            lines.append(f"  {r['request']:>3} {r['position']:>4} {repr(r['text'])[:14]:<14} {r['logp_rollout']:>12.5f} "
                         f"{r['logp_train']:>12.5f} {r['diff']:>10.3g}")
    loc = report.get("localisation") or {}
    if loc.get("skipped"):
        lines.append(f"localisation skipped: {loc['skipped']}")
    elif loc.get("stages"):
        first = loc.get("first")
        if loc.get("note"):
            lines.append(f"localisation: {loc['note']}")
        lines.append("first divergence: " + (f"{first['stage']} ({first['points_at']})" if first else
                                             "none: every stage within its band"))
    return "\n".join(lines)


def write_report(report: Dict[str, Any], out: str) -> Dict[str, str]:
    """report.json, tokens.csv, stages.csv and report.html under `out`; returns their paths."""
    os.makedirs(out, exist_ok=True)
    paths = {"json": os.path.join(out, "report.json"), "tokens": os.path.join(out, "tokens.csv"),
             "stages": os.path.join(out, "stages.csv"), "html": os.path.join(out, "report.html")}
    write_json_atomic(paths["json"], report, fsync=False)
    _csv(paths["tokens"], report["tokens"], ["request", "position", "token", "text", "logp_rollout", "logp_train", "diff"])
    _csv(paths["stages"], (report.get("localisation") or {}).get("stages") or [],
         ["stage", "op", "layer", "engine_module", "rel", "band", "above"])
    with open(paths["html"], "w", encoding="utf-8") as f:
        f.write(html_page(report))
    return paths


def _csv(path: str, rows: List[Dict[str, Any]], fields: List[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def _bars(values: List[float], band: List[float], labels: List[str], title: str, log: bool,
          hot: List[bool]) -> str:
    """A bar chart as inline SVG; the band as a line (one per bar when it varies)."""
    W, H, L, B = 1200, 270, 110, 70
    n = max(len(values), 1)
    bw = (W - L - 10) / n
    finite = [v for v in values + band if v is not None and v > 0 and math.isfinite(v)]
    lo = min(finite) / 3 if finite else 1e-9
    hi = max(finite) * 1.5 if finite else 1.0

    def y(v: float) -> float:
        if v is None or not math.isfinite(v) or v <= 0:
            return H - B
        if log:
            return H - B - (H - B - 20) * (math.log10(max(v, lo)) - math.log10(lo)) / max(math.log10(hi / lo), 1e-9)
        return H - B - (H - B - 20) * v / hi

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img">',
             f'<text x="{L}" y="14" font-size="13" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{L}" y1="{H - B}" x2="{W - 10}" y2="{H - B}" stroke="#444"/>']
    for k in range(n if values else 0):
        v = values[k]
        x = L + k * bw
        color = "#d9534f" if hot[k] else "#5b8def"
        top = y(v)
        parts.append(f'<rect x="{x + 1:.1f}" y="{top:.1f}" width="{max(bw - 2, 1):.1f}" height="{H - B - top:.1f}" '
                     f'fill="{color}"><title>{html.escape(labels[k])}: {v if v is None else f"{v:.3g}"}</title></rect>')
        if band[k] is not None:
            by = y(band[k])
            parts.append(f'<line x1="{x:.1f}" y1="{by:.1f}" x2="{x + bw:.1f}" y2="{by:.1f}" stroke="#2a2" '
                         f'stroke-width="2"/>')
        if n <= 40:
            parts.append(f'<text x="{x + bw / 2:.1f}" y="{H - B + 12}" font-size="9" text-anchor="end" '
                         f'transform="rotate(-40 {x + bw / 2:.1f} {H - B + 12})">{html.escape(labels[k][-28:])}</text>')
    for v in (lo, hi) if finite else ():
        parts.append(f'<text x="{L - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{v:.1e}</text>')
    parts.append(f'<text x="{W - 10}" y="14" font-size="11" text-anchor="end" fill="#2a2">green: noise band</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(rows: List[Dict[str, Any]], fields: List[str]) -> str:
    head = "".join(f"<th>{html.escape(f)}</th>" for f in fields)
    body = []
    for r in rows:
        cells = []
        for f in fields:
            v = r.get(f)
            s = f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
            cells.append(f"<td>{html.escape(s)}</td>")
        cls = ' class="hot"' if r.get("above") else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def html_page(report: Dict[str, Any]) -> str:
    v, lp, w = report["verdict"], report["logprobs"], report["weights"]
    toks = report["tokens"]
    color = "#2a7" if v["status"] == "PASS" else "#c33"
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>tsprobe rl-check</title><style>",
           "body{font-family:'Liberation Sans',Arial,sans-serif;margin:20px;max-width:1300px}",
           "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}",
           "tr.hot td{background:#fde2e2}.verdict{font-size:20px;font-weight:bold;color:" + color + "}",
           "h2{font-size:16px;margin-top:22px}</style></head><body>",
           "<h1>tsprobe rl-check: trainer vs rollout engine</h1>",
           f"<div class='verdict'>{v['status']}{' — ' + html.escape(str(v['cause'])) if v['cause'] else ''}</div>",
           f"<p>{html.escape(v['message'])}</p>"]
    if report["findings"]:
        out.append("<ul>" + "".join(f"<li><b>{html.escape(f['kind'])}</b>: {html.escape(f['message'])}</li>"
                                    for f in report["findings"]) + "</ul>")
    out.append("<h2>1. Are my weights synced?</h2>")
    out.append(f"<p>{w['checked']} parameters compared by CRC-32 (trainer cast to the engine's {w['engine_dtype']}; "
               f"fused qkv_proj / gate_up_proj cut into the trainer's pieces): <b>{len(w['differ'])} differ</b>.</p>")
    if w["differ"]:
        out.append(_table([{"parameter": d["name"], "trainer crc32": d["trainer"]["crc32"],
                            "engine crc32": d["engine"]["crc32"], "trainer norm": d["trainer"]["Norm"],
                            "engine norm": d["engine"]["Norm"]} for d in w["differ"][:40]],
                          ["parameter", "trainer crc32", "engine crc32", "trainer norm", "engine norm"]))
    out.append("<h2>2. How big is the mismatch?</h2>")
    out.append(f"<p>Semantics compared: {html.escape(lp['semantics'])}. {lp['tokens']} sampled tokens: max |dlogp| "
               f"<b>{lp['max_abs']:.3g}</b>, mean {lp['mean_abs']:.3g}, KL estimate (k3) {lp['kl_k3']:.3g}, "
               f"importance ratio in [{lp.get('ratio_min', 1):.4g}, {lp.get('ratio_max', 1):.4g}]; noise band "
               f"{lp['band']:.3g}.</p>")
    out.append(_bars([abs(r["diff"]) for r in toks], [lp["band"]] * len(toks),
                     [f"req{r['request']} pos{r['position']} {r['text']!r}" for r in toks],
                     "|logp_train - logp_rollout| per sampled token (log scale)", True,
                     [abs(r["diff"]) > lp["band"] for r in toks]))
    out.append(_table(lp["worst"], ["request", "position", "token", "text", "logp_rollout", "logp_train", "diff"]))
    out.append("<h2>3. Where does it start?</h2>")
    loc = report.get("localisation") or {}
    if loc.get("skipped"):
        out.append(f"<p>Skipped: {html.escape(loc['skipped'])}</p>")
    elif loc.get("stages"):
        st = loc["stages"]
        first = loc.get("first")
        out.append(f"<p>Both forwards dumped on request {loc.get('request')}'s {loc['sequence_len']} tokens (engine: "
                   f"prefill replay). First stage beyond its band: <b>"
                   f"{html.escape(first['stage'] + ' — ' + first['points_at']) if first else 'none'}</b>.</p>")
        if loc.get("note"):
            out.append(f"<p><b>Note:</b> {html.escape(loc['note'])}.</p>")
        out.append(_bars([r["rel"] for r in st], [r["band"] for r in st], [r["stage"] for r in st],
                         "relative L2 difference per stage, engine vs trainer (log scale)", True,
                         [bool(r.get("above")) for r in st]))
        out.append(_table(st, ["stage", "op", "engine_module", "rel", "band", "above"]))
        gen = loc.get("generic") or {}
        if gen.get("first"):
            out.append(f"<p>tsprobe's call-by-call engine on the same two dumps (dtype tolerances, no band; vLLM's "
                       f"fused calls unpaired): first divergence <code>{html.escape(gen['first']['key'])}</code> — "
                       f"{html.escape(gen['first']['cause'])} (<a href='{html.escape(gen.get('report') or '')}'>its "
                       f"report</a>).</p>")
    if report.get("config_diff"):
        out.append("<h2>Config differences</h2>" + _table(report["config_diff"], ["key", "trainer", "engine"]))
    out.append("</body></html>")
    return "\n".join(out)
