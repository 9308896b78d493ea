"""Stacks read in C (``native.frame_walker``) must give exactly the Python walk's stack.json."""
import gc
import threading

import pytest

from ts_core import native
from ts_core.record.stack import StackRecorder

pytestmark = pytest.mark.skipif(native.frame_walker() is None, reason="native library not built (no C compiler)")


def _pair():
    fast, slow = StackRecorder(), StackRecorder()
    slow._native = None
    assert fast._native is not None
    return fast, slow


def _both(fast, slow, out):
    out.append((fast.capture(), slow.capture()))      # one line: both see the same caller stack


def test_same_ids_and_text_as_the_python_walk_in_many_contexts():
    fast, slow = _pair()
    seen = []

    def leaf():
        _both(fast, slow, seen)

    def recurse(n):
        if n == 0:
            _both(fast, slow, seen)
        else:
            recurse(n - 1)

    def gen():
        _both(fast, slow, seen)
        yield
        _both(fast, slow, seen)

    for _ in range(3):                   # repeats hit the raw cache
        leaf()
        for depth in (0, 3, 7):
            recurse(depth)
        list(gen())
        _both(fast, slow, seen)
        [leaf() for _ in range(2)]
        (lambda: _both(fast, slow, seen))()
    t = threading.Thread(target=leaf)
    t.start()
    t.join()
    fast.reset()
    slow.reset()                        # a new folder: ids restart, text is kept
    leaf()
    recurse(2)
    assert len(seen) == 3 * 10 + 1 + 2
    for (fid, ftext), (sid, stext) in seen:
        assert fid == sid and ftext == stext
    texts = [s[1] for _, s in seen if s[1] is not None]
    assert all("in _both" in t[0] for t in texts)
    assert any("in recurse" in t[1] and sum("in recurse" in f for f in t) == 8 for t in texts)
    assert any("in gen" in t[1] for t in texts) and any("<lambda>" in t[1] for t in texts)
    assert not any("ts_core" in f for t in texts for f in t)


def test_a_freed_code_object_never_lends_its_address_to_another():
    """Code compiled at run time (exec, dataclasses, torch.compile) can be freed and its
    address reused: the recorder must still name the code that really ran."""
    fast, slow = _pair()
    got = []
    for i in range(60):
        scope = {"capture": lambda: got.append((fast.capture(), slow.capture()))}
        exec(compile("\n" * i + f"def fn_{i}():\n    capture()\n", f"<generated {i}>", "exec"), scope)
        scope["fn_" + str(i)]()
        del scope
        gc.collect()
    texts = {}
    for i, ((fid, ftext), (sid, stext)) in enumerate(got):
        assert fid == sid and ftext == stext
        if ftext is not None:
            texts[fid] = ftext
        assert f"in fn_{i}," in texts[fid][1] and f"<generated {i}>" in texts[fid][1]
