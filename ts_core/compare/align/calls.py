"""Aligned call pairs of two dumps, and whether the alignment shows one program.

Per direction (forward, backward, other), module records and API calls apart and the model's
forward apart from forward calls made during or after backward: by name and order first
(``matching.align``), the gaps by data flow (``refine``), ``parameters_grad`` by key; merged
back in execution order.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ...dumpfmt import BACKWARD, FORWARD, OTHER
from ..load.loader import Call
from .dataflow import Facts
from .matching import align
from .pairs import CallPair, in_time_order, members
from .refine import Side, forward_partners, refine


def align_calls(gcalls: List[Call], tcalls: List[Call], opts: Any,
                golden_name: Optional[Callable[[str], str]] = None,
                target_name: Optional[Callable[[str], str]] = None, cross: bool = False,
                golden_parents: Optional[dict] = None, target_parents: Optional[dict] = None,
                facts: Optional[Facts] = None) -> List[List[CallPair]]:
    """Aligned call pairs per direction, in execution order: forward, backward, other.

    Module records and API calls are aligned apart (tools and frameworks emit a module's
    record before or after its inner calls), and so are the forward calls of the model and
    those made during or after the backward pass; each by name and order first
    (``matching.align``), then the gaps by data flow (``refine``); all are merged back in
    execution order.
    parameters_grad records pair by exact key instead, since tools place them differently
    (msprobe: before the module's backward record). ``golden_name``/``target_name`` give the
    name a key is aligned under (cross-framework: MindSpore keys in torch vocabulary);
    ``*_parents`` each side's construct.json.
    """
    gn = golden_name or _same
    tn = target_name or _same
    facts = facts or Facts()
    g_side, t_side = Side(gcalls, gn, golden_parents, facts), Side(tcalls, tn, target_parents, facts)
    out = []
    partners: dict = {}
    for direction in (FORWARD, BACKWARD, OTHER):
        gs = [c for c in gcalls if c.direction == direction]
        ts = [c for c in tcalls if c.direction == direction]
        lists = []
        # forward calls made during or after the backward pass (a custom backward, the optimizer)
        # align among themselves, not with the model's forward
        for modules, late in ((True, False), (False, False), (True, True), (False, True)):
            g_seq = [c for c in gs if c.kind != "parameters_grad" and (c.kind == "module") == modules
                     and (direction == FORWARD and g_side.after_backward(c)) == late]
            t_seq = [c for c in ts if c.kind != "parameters_grad" and (c.kind == "module") == modules
                     and (direction == FORWARD and t_side.after_backward(c)) == late]
            raw = [CallPair(g_seq[i] if i is not None else None, t_seq[j] if j is not None else None, direction)
                   for i, j in align([gn(c.key) for c in g_seq], [tn(c.key) for c in t_seq], opts.normalise)]
            lists.append(refine(raw, g_side, t_side, cross, partners if direction == BACKWARD else None))
        if direction == FORWARD:
            partners = forward_partners([cp for seq in lists for cp in seq])
        out.append(_insert_keyed(in_time_order(lists), gs, ts, direction, gn, tn))
    return out


def _same(key: str) -> str:
    return key


def _classless(key: str) -> str:
    """``Module.fc.Linear.parameters_grad.0`` -> ``Module.fc.parameters_grad.0``."""
    head, _, rest = key.rpartition(".parameters_grad.")
    return f"{head.rsplit('.', 1)[0]}.parameters_grad.{rest}" if head else key


def _insert_keyed(pairs: List[CallPair], gs: List[Call], ts: List[Call], direction: str,
                  gn: Callable[[str], str] = _same, tn: Callable[[str], str] = _same) -> List[CallPair]:
    """Pair parameters_grad records by key; place each after the call that preceded it."""
    where = {}
    for i, p in enumerate(pairs):
        for c in (p.golden, p.target):
            for m in ([c] + members(c) if c is not None else []):
                where[id(m)] = i
    after: Dict[int, List[CallPair]] = {}
    t_grads = {tn(c.key): c for c in ts if c.kind == "parameters_grad"}
    g_keys = {gn(c.key) for c in gs if c.kind == "parameters_grad"}
    # a module class renamed on one side (Linear -> MatLinear, same computation): its gradients
    # pair by module path, as its forward records pair, when the exact key has no partner
    loose: Dict[str, str] = {}
    for k in t_grads:
        if k not in g_keys:
            loose[_classless(k)] = k if _classless(k) not in loose else ""
    for side_calls, is_golden in ((gs, True), (ts, False)):
        prev = -1
        for c in side_calls:
            if c.kind != "parameters_grad":
                prev = where[id(c)] if id(c) in where else where[id(members(c)[0])]
            elif is_golden:
                partner = t_grads.pop(gn(c.key), None)
                if partner is None and loose.get(_classless(gn(c.key))):
                    partner = t_grads.pop(loose[_classless(gn(c.key))], None)
                after.setdefault(prev, []).append(CallPair(c, partner, direction))
            elif tn(c.key) in t_grads:
                after.setdefault(prev, []).append(CallPair(None, c, direction))
    merged = list(after.get(-1, []))
    for i, p in enumerate(pairs):
        merged.append(p)
        merged.extend(after.get(i, []))
    return merged


MIN_MATCHED_SHARE = 0.5     # below this share of paired calls on both sides: different programs


def same_program(seqs: List[List[CallPair]]) -> dict:
    """Do two dumps describe the same program? Not when, on each side, fewer than
    MIN_MATCHED_SHARE of the calls that could change a result found a partner (one side may
    record more: MindSpore's loss Cells, a framework's extra ops), or when both record modules
    and none pairs. Returns the counts and, when they differ, the evidence in words."""
    pairs = [cp for seq in seqs for cp in seq if cp.kind != "parameters_grad"]
    counted = [cp for cp in pairs if cp.matched or not cp.harmless]
    matched = sum(1 for cp in counted if cp.matched)
    only_g = sum(1 for cp in counted if cp.target is None)
    only_t = sum(1 for cp in counted if cp.golden is None)
    # a side that records nothing pairs nothing (its share is 0, not "all of nothing")
    share = max(matched / (matched + only_g) if matched + only_g else 0.0,
                matched / (matched + only_t) if matched + only_t else 0.0)
    modules = {"golden": [cp.golden for cp in pairs if cp.kind == "module" and cp.golden is not None],
               "target": [cp.target for cp in pairs if cp.kind == "module" and cp.target is not None]}
    no_common_tree = bool(modules["golden"] and modules["target"]) and not any(
        cp.matched for cp in pairs if cp.kind == "module")
    if not counted:       # nothing recorded on either side: nothing was checked, which is no pass
        return {"same": False, "matched": 0, "calls": 0, "only_golden": 0, "only_target": 0, "matched_share": 0.0,
                "min_matched_share": MIN_MATCHED_SHARE, "common_module_tree": False,
                "evidence": "nothing was compared: neither dump records a call (an empty step, or a dump made "
                            "with a scope or list that matched nothing); re-dump the steps that ran the model"}
    out = {"same": share >= MIN_MATCHED_SHARE and not no_common_tree, "matched": matched, "calls": len(counted),
           "only_golden": only_g, "only_target": only_t, "matched_share": round(share, 4),
           "min_matched_share": MIN_MATCHED_SHARE, "common_module_tree": not no_common_tree, "evidence": ""}
    if not out["same"]:
        why = [f"{matched} calls paired, {only_g} only in golden, {only_t} only in target (in one program, "
               f"at least {MIN_MATCHED_SHARE:.0%} of one side's calls pair)"]
        if no_common_tree:
            names = {side: ", ".join(list(dict.fromkeys(c.key.rsplit(".", 2)[0] for c in calls))[:3])
                     for side, calls in modules.items()}
            why.append(f"no module in common (golden: {names['golden']} ...; target: {names['target']} ...)")
        out["evidence"] = ("the two dumps do not describe the same program: " + "; ".join(why)
                           + ". Calls of two programs were paired only by chance: their rows say nothing about "
                             "precision; compare two dumps of the same model")
    return out
