"""msprobe's command line spelling works: ``tsprobe compare -tp TARGET -gp GOLDEN -o OUT``."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dump(root, scale: float) -> str:
    rank = root / "step0" / "rank"
    rank.mkdir(parents=True)

    def rec(v):
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "Max": v, "Min": -v,
                "Mean": 0.0, "Norm": 2 * v, "requires_grad": False}
    data = {f"Functional.linear.{i}.forward": {"input_args": [rec(1.0)], "input_kwargs": {},
                                                "output": [rec(1.0 if i < 2 else scale)]} for i in range(4)}
    (rank / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                "dump_data_dir": None, "data": data}))
    return str(root / "step0")


def _compare(*args):
    return subprocess.run([sys.executable, "-m", "ts_core.cli", "compare", *args, "--json", "--no-html"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_msprobe_flags_give_what_the_positional_form_gives(tmp_path):
    golden, target = _dump(tmp_path / "g", 1.0), _dump(tmp_path / "t", 3.0)
    plain = _compare(golden, target, "-o", str(tmp_path / "a"))
    msprobe = _compare("-tp", target, "-gp", golden, "--output_path", str(tmp_path / "b"))
    assert plain.returncode == msprobe.returncode == 1, plain.stderr + msprobe.stderr     # a divergence
    a, b = json.loads(plain.stdout), json.loads(msprobe.stdout)
    assert a.get("first_divergence") and a["first_divergence"] == b["first_divergence"]
    assert "linear.2" in json.dumps(a["first_divergence"])
    twice = _compare(golden, target, "-gp", golden)
    assert twice.returncode == 2 and "given twice" in twice.stderr
    missing = _compare("-tp", target)
    assert missing.returncode == 2 and "-gp GOLDEN -tp TARGET" in missing.stderr


def test_a_note_of_every_step_is_printed_once_and_only_warnings_say_warning():
    from types import SimpleNamespace

    from ts_core.compare.report.text import _pair_messages

    note = "cross-framework compare (pytorch vs mindspore): calls paired through the torch<->MindSpore mapping"
    pairs = [SimpleNamespace(warnings=[note]), SimpleNamespace(warnings=[note]),
             SimpleNamespace(warnings=[note, "target dump is marked incomplete (the run stopped early): /d"])]
    assert _pair_messages(pairs) == [f"note: {note} (3 step/rank pairs)",
                                     "warning: target dump is marked incomplete (the run stopped early): /d"]


def test_the_program_ends_a_compare_with_its_exit_code_output_and_atexit_handlers(tmp_path):
    """``tsprobe`` (cli.entry) ends a local compare without tearing the interpreter down: the exit
    code, all it printed to a pipe (still in the buffer at the end) and atexit handlers survive."""
    golden, target = _dump(tmp_path / "g", 1.0), _dump(tmp_path / "t", 3.0)
    program = ("import atexit, sys; atexit.register(lambda: print('atexit ran', file=sys.stderr)); "
               "from ts_core.cli import entry; entry()")

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}       # stdout block-buffered

    def run(*args):
        return subprocess.run([sys.executable, "-c", program, "compare", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env=env)
    found = run(golden, target, "--json", "--no-html", "-o", str(tmp_path / "out"))
    assert found.returncode == 1, found.stderr
    assert "linear.2" in json.dumps(json.loads(found.stdout)["first_divergence"])
    assert found.stderr.rstrip().endswith("atexit ran")
    assert len((tmp_path / "out" / "compare.csv").read_text().splitlines()) == 1 + 8     # header + 8 values
    same = run(golden, _dump(tmp_path / "g2", 1.0), "--no-html")
    assert same.returncode == 0 and "PASS" in same.stdout and same.stderr.rstrip().endswith("atexit ran")
    bad = run(golden, str(tmp_path / "missing"))
    assert bad.returncode == 2 and "tsprobe compare: error:" in bad.stderr and bad.stderr.rstrip().endswith("atexit ran")


def test_the_compare_engine_loads_with_one_blas_thread_and_leaves_env_and_gc_as_they_were():
    """cli._load_compare_engine: OpenBLAS starts no spinning thread of its own (the process has
    only its main thread after numpy loads), the environment children see and the GC are as
    before; a user's OPENBLAS_NUM_THREADS is theirs."""
    probe = ("import gc, os, sys; from ts_core import cli; cli._load_compare_engine(); "
             "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'), gc.isenabled())")

    def run(**env):
        base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**base, **env})
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    assert run() == ["1", "None", "True"]
    if os.cpu_count() >= 2:                  # the user's choice: OpenBLAS's threads start
        threads, value, gc_on = run(OPENBLAS_NUM_THREADS="2")
        assert int(threads) == 2 and value == "2" and gc_on == "True"
