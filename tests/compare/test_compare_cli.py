import json
import os
import subprocess
import sys

import numpy as np

from compare_dumpgen import DumpWriter, write_chain
from ts_core.cli import main


def test_compare_command_writes_outputs(tmp_path, capsys):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", w_delta=0.01)
    rc = main(["compare", str(tmp_path / "g"), str(tmp_path / "t"), "-o", str(tmp_path / "out"), "--rtol", "1e-3"])
    assert rc == 1                        # a divergence (verdict ERROR): exit status 1
    out = capsys.readouterr().out
    assert "First divergence: Tensor.__add__.0.forward" in out
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"compare.csv", "summary.json", "report.html"}
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["tolerances"]["overrides"] == {"rtol": 1e-3}
    assert s["first_divergence"]["metrics"]["rtol"] == 1e-3


def test_fail_on_divergence_and_json(tmp_path, capsys):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", grad_bug=2.0)
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "t"), "--fail-on-divergence", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["first_divergence"]["key"] == "Torch.tanh.0.backward"
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "g"), "--fail-on-divergence", "--stats-only"]) == 0


def test_bad_input_is_one_line_naming_the_file(tmp_path, capsys):
    write_chain(tmp_path / "g")
    bad = tmp_path / "t" / "step0" / "rank0"
    bad.mkdir(parents=True)
    (bad / "dump.json").write_text('{"data": {"a": ')
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad / "dump.json") in err and "Traceback" not in err
    assert main(["summary", str(tmp_path / "missing")]) == 2
    assert "missing: no such file or directory" in capsys.readouterr().err


def test_summary_reports_counts_mode_and_first_nonfinite(tmp_path, capsys):
    d = DumpWriter(tmp_path / "d", task="statistics")
    x = np.ones(3, np.float32)
    d.forward("Torch.a.0.forward", [x], [x])
    d.forward("Torch.log.0.forward", [x - 1], [np.full(3, -np.inf, np.float32)])   # log(0)
    d.forward("Torch.b.0.forward", [np.full(3, -np.inf, np.float32)], [x * np.nan])
    d.backward("Torch.a.0.backward", [x], [x])
    d.params_grad("Module.fc.Linear.parameters_grad.0", {"weight": x})
    d.close()
    assert main(["summary", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "3 forward, 1 backward, 1 parameters_grad" in out and "statistics only" in out
    assert "first NaN/Inf: Torch.log.0.forward.output.0" in out
    assert main(["summary", str(tmp_path / "d"), "--json"]) == 0
    item = json.loads(capsys.readouterr().out)[0]
    assert item["first_nonfinite"]["key"] == "Torch.log.0.forward" and item["tensor_mode"] is False
    assert item["step"] == 0 and item["rank"] == "rank0" and item["records"] == 5


def test_console_script_entry_point(tmp_path):
    write_chain(tmp_path / "g")
    exe = os.path.join(os.path.dirname(sys.executable), "tsprobe")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "ts_core.cli"]
    p = subprocess.run(cmd + ["summary", str(tmp_path / "g")], capture_output=True, text=True)
    assert p.returncode == 0 and "1 dump(s)" in p.stdout


def test_compare_package_imports_and_runs_without_torch(tmp_path):
    """Only numpy + pyyaml are needed to compare .npy dumps; torch must not be imported."""
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", w_delta=0.01)
    code = ("import sys; sys.modules['torch'] = None\n"
            "import ts_core.compare as c\n"
            f"r = c.compare({str(tmp_path / 'g')!r}, {str(tmp_path / 't')!r}, verbose=False)\n"
            "print(r.first_divergence.key)\n"
            "import ts_core.compat as compat\n"
            "compat.compare_npy_dir\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "Tensor.__add__.0.forward"


def test_the_exit_status_follows_one_policy_said_in_the_help(tmp_path, capsys):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", grad_bug=2.0)
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "g")]) == 0            # PASS
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "t")]) == 1            # ERROR
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "t"), "--json"]) == 1  # whatever the output
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "missing")]) == 2      # bad input
    capsys.readouterr()
    try:
        main(["compare", "--help"])
    except SystemExit:
        pass
    text = capsys.readouterr().out
    assert "exit status:" in text and all(f"\n  {n}  " in text for n in (0, 1, 2))
