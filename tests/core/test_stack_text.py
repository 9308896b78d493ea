"""The stack-frame text has one home (dumpfmt/stack.py): what the recorder writes into
stack.json is what compare, acc-check and ``tsprobe summary`` parse back. Checked against
Python's own account of the same frames (``traceback``), not against the formatter."""
from __future__ import annotations

import traceback

from ts_core.dumpfmt.stack import format_frame, one_line, parse_frame, user_frame
from ts_core.record.stack import StackRecorder


def _record_here():
    return StackRecorder().capture(), traceback.extract_stack()


def test_recorded_frames_parse_back_to_the_frames_python_reports():
    (_, frames), summary = _record_here()
    assert frames, "the recorder wrote no frame of this test"
    ours = {(fs.filename, fs.lineno, fs.name, (fs.line or "").strip()) for fs in summary}
    parsed = [parse_frame(text) for text in frames]
    assert all(p is not None for p in parsed), frames
    for p in parsed:
        assert (p.file, p.line, p.func, p.code) in ours, p
    mine = next(p for p in parsed if p.func == "_record_here")
    assert mine.code == "return StackRecorder().capture(), traceback.extract_stack()"


def test_user_frame_and_one_line_read_the_written_text():
    text = format_frame("/home/u/train.py", 42, "step", "loss = model(x)")
    lib = format_frame("/v/lib/python3.11/site-packages/torch/nn/modules/module.py", 7, "_call_impl", "return f(x)")
    assert text == "File /home/u/train.py, line 42, in step, \n loss = model(x)"     # msprobe's spelling
    assert user_frame([lib, text]) == "/home/u/train.py:42 in step: loss = model(x)"
    assert one_line(text) == "File /home/u/train.py, line 42, in step: loss = model(x)"
    assert parse_frame("not a frame") is None
