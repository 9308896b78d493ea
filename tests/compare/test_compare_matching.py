import random

import pytest

from ts_core.compare.align.matching import align, default_normalise, forward_key, parse_key


@pytest.mark.parametrize("key,name,direction,kind,n", [
    ("Functional.linear.0.forward", "Functional.linear", "forward", "api", 0),
    ("Tensor.__add__.3.backward", "Tensor.__add__", "backward", "api", 3),
    ("Module.encoder.layer.0.Linear.forward.0", "Module.encoder.layer.0.Linear", "forward", "module", 0),
    ("Module.fc.Linear.backward.2", "Module.fc.Linear", "backward", "module", 2),
    ("Module.fc.Linear.parameters_grad.0", "Module.fc.Linear", "backward", "parameters_grad", 0),
    ("Cell.fc.Dense.forward.0", "Cell.fc.Dense", "forward", "module", 0),
    ("Primitive.matmul.MatMul.0.forward", "Primitive.matmul.MatMul", "forward", "api", 0),
    ("x.0.debug", "x.0.debug", "other", "other", None),
])
def test_parse_key(key, name, direction, kind, n):
    info = parse_key(key)
    assert (info.name, info.direction, info.kind, info.counter) == (name, direction, kind, n)


def test_forward_key():
    assert forward_key("Tensor.__add__.3.backward") == "Tensor.__add__.3.forward"
    assert forward_key("Module.fc.Linear.backward.1") == "Module.fc.Linear.forward.1"


def test_extra_call_shifting_counters_keeps_the_rest_matched():
    golden = ["Tensor.reshape.0.forward", "Functional.linear.0.forward", "Tensor.reshape.1.forward",
              "Functional.gelu.0.forward"]
    target = ["Tensor.reshape.0.forward", "Functional.linear.0.forward", "Tensor.contiguous.0.forward",
              "Tensor.reshape.1.forward", "Tensor.reshape.2.forward", "Functional.gelu.0.forward"]
    pairs = align(golden, target)
    named = [(golden[i] if i is not None else None, target[j] if j is not None else None) for i, j in pairs]
    assert ("Functional.gelu.0.forward", "Functional.gelu.0.forward") in named
    assert (None, "Tensor.contiguous.0.forward") in named
    assert sum(1 for g, t in named if g and t) == 4
    assert sum(1 for g, t in named if g is None) == 2     # contiguous + one reshape only in target


def _check_alignment(a, b, pairs):
    gi = [i for i, _ in pairs if i is not None]
    tj = [j for _, j in pairs if j is not None]
    assert sorted(gi) == list(range(len(a))) and sorted(tj) == list(range(len(b)))   # nothing dropped
    matched = [(i, j) for i, j in pairs if i is not None and j is not None]
    assert all(default_normalise(a[i]) == default_normalise(b[j]) for i, j in matched)
    assert [i for i, _ in matched] == sorted(i for i, _ in matched)                   # order preserved
    assert [j for _, j in matched] == sorted(j for _, j in matched)
    return len(matched)


def test_large_repetitive_sequences_align_around_scattered_insertions():
    # a transformer-like call list: the same few API names repeat thousands of times
    layer = ["Functional.layer_norm", "Functional.linear", "Tensor.__add__", "Functional.gelu",
             "Functional.linear", "Tensor.__add__"]
    golden_names = []
    for l in range(1500):
        golden_names += layer + [f"Module.layers.{l}.Block"]
    rnd = random.Random(0)
    target_names = list(golden_names)
    inserts = sorted(rnd.sample(range(len(golden_names)), 5), reverse=True)
    for pos in inserts:
        target_names.insert(pos, "Tensor.contiguous")

    def keys(names):
        count, out = {}, []
        for nm in names:
            n = count.get(nm, 0); count[nm] = n + 1
            out.append(f"{nm}.forward.{n}" if nm.startswith("Module") else f"{nm}.{n}.forward")
        return out

    a, b = keys(golden_names), keys(target_names)
    pairs = align(a, b)
    assert _check_alignment(a, b, pairs) == len(a)     # every golden call keeps its partner


def test_missing_and_replaced_calls_are_kept_as_unmatched_rows():
    a = ["A.x.0.forward", "A.y.0.forward", "A.z.0.forward"]
    b = ["A.x.0.forward", "A.q.0.forward", "A.z.0.forward"]
    pairs = align(a, b)
    assert _check_alignment(a, b, pairs) == 2
    assert (1, None) in pairs and (None, 1) in pairs


def test_normaliser_is_replaceable():
    mapping = {"Cell.fc.Dense": "fc", "Module.fc.Linear": "fc"}
    norm = lambda k: mapping.get(parse_key(k).name, k)
    assert align(["Module.fc.Linear.forward.0"], ["Cell.fc.Dense.forward.0"], norm) == [(0, 0)]
    assert align(["Module.fc.Linear.forward.0"], ["Cell.fc.Dense.forward.0"]) == [(0, None), (None, 0)]


def _lcs_length(a, b):
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_myers_path_is_a_longest_common_subsequence():
    from ts_core.compare.align.matching import _myers
    rnd = random.Random(3)
    for _ in range(200):
        a = [rnd.choice("abcd") for _ in range(rnd.randint(0, 30))]
        b = [rnd.choice("abcd") for _ in range(rnd.randint(0, 30))]
        out = []
        assert _myers(a, b, 0, len(a), 0, len(b), out, max_d=60)
        assert _check_alignment_raw(a, b, out) == _lcs_length(a, b)


def _check_alignment_raw(a, b, pairs):
    assert sorted(i for i, _ in pairs if i is not None) == list(range(len(a)))
    assert sorted(j for _, j in pairs if j is not None) == list(range(len(b)))
    matched = [(i, j) for i, j in pairs if i is not None and j is not None]
    assert all(a[i] == b[j] for i, j in matched)
    assert [j for _, j in matched] == sorted(j for _, j in matched)
    return len(matched)


def test_long_sequences_of_few_names_with_many_edits_stay_aligned():
    names = ["Functional.linear", "Tensor.__add__", "Functional.gelu", "Tensor.__mul__"]
    rnd = random.Random(7)
    g = [rnd.choice(names) for _ in range(30000)]
    t = list(g)
    for p in sorted(rnd.sample(range(len(g)), 30), reverse=True):
        t.insert(p, rnd.choice(names))          # extra calls of existing names shift their counters
    for p in sorted(rnd.sample(range(len(t)), 30), reverse=True):
        del t[p]

    def keys(ns):
        count, out = {}, []
        for nm in ns:
            n = count.get(nm, 0); count[nm] = n + 1
            out.append(f"{nm}.{n}.forward")
        return out

    a, b = keys(g), keys(t)
    # at most 60 edits: all but <= 30 golden calls keep a partner
    assert _check_alignment(a, b, align(a, b)) >= len(a) - 30
