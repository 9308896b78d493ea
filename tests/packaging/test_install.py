"""What a pip user gets: a fresh venv with ``pip install <checkout>`` builds the C extension and
uses it (or runs the pure paths when no compiler was there), writes nothing at run time;
``requires-python`` is what the code needs; the CLI's --version and closed pipes."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import venv

import pytest

from ..conftest import require

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pyproject_min() -> tuple:
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    m = re.search(r'^requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', text, re.M)
    assert m, "pyproject.toml states requires-python as '>=X.Y'"
    return int(m.group(1)), int(m.group(2))


@require("vermin")
def test_requires_python_is_what_the_code_needs():
    """vermin reads the oldest Python each construct and library call needs (``bisect_left(key=)``
    is 3.10); pyproject.toml must not promise an older one."""
    vermin = os.path.join(os.path.dirname(sys.executable), "vermin")
    proc = subprocess.run([vermin, "--no-tips", "--eval-annotations", "--no-parse-comments",
                           "ts_core", "ts_integrations", "setup.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    m = re.search(r"Minimum required versions?: (?:2\.\d+, )?(\d+)\.(\d+)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    needed = (int(m.group(1)), int(m.group(2)))
    assert needed <= _pyproject_min(), f"the code needs Python {needed}, pyproject.toml says >={_pyproject_min()}"


def test_version_names_the_package_and_the_kernels():
    from ts_core import native
    from ts_core._version import __version__

    out = subprocess.run([sys.executable, "-m", "ts_core.cli", "--version"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith(f"tsprobe {__version__} (Python ")
    assert ("native kernels: in use" in out) == native.available()
    pure = subprocess.run([sys.executable, "-m", "ts_core.cli", "--version"], cwd=ROOT, capture_output=True,
                          text=True, check=True, env=dict(os.environ, TSPROBE_NATIVE="0")).stdout
    assert "native kernels: not in use (TSPROBE_NATIVE=0)" in pure
    for extra in ("isal", "msgspec"):         # the extra `fast`, each said in use or not
        line = next(x for x in out.splitlines() if x.startswith(f"{extra}: "))
        installed = importlib.util.find_spec(extra) is not None
        assert line.startswith(f"{extra}: {'in use' if installed else 'not installed'}")
        assert ("tsprobe[fast]" in line) == (not installed)


def test_a_reader_that_goes_away_ends_the_cli_quietly(tmp_path):
    """``tsprobe summary DUMP | head``: no 'Broken pipe' traceback, SIGPIPE's exit status."""
    rank = tmp_path / "dump" / "step0" / "rank"
    rank.mkdir(parents=True)
    rec = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
           "Norm": 1.0, "requires_grad": False}
    data = {f"Functional.linear.{i}.forward": {"input_args": [rec], "input_kwargs": {}, "output": [rec]}
            for i in range(3000)}
    (rank / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                "dump_data_dir": None, "data": data}))
    proc = subprocess.Popen([sys.executable, "-m", "ts_core.cli", "summary", "--json", str(tmp_path / "dump")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                           # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "Broken pipe" not in err, err


def _site_packages(env_dir: str) -> str:
    out = subprocess.run([os.path.join(env_dir, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _fresh_env(tmp_path, name: str, wheel: str) -> str:
    """A new venv holding the wheel and only numpy + pyyaml of the test venv (linked, not
    downloaded: the test runs offline)."""
    env_dir = str(tmp_path / name)
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = _site_packages(env_dir)
    import numpy
    import yaml

    deps = tmp_path / "deps"
    if not deps.exists():
        deps.mkdir()
        for mod in (numpy, yaml):
            pkg_dir = os.path.dirname(mod.__file__)
            os.symlink(pkg_dir, deps / os.path.basename(pkg_dir))
            libs = pkg_dir + ".libs"
            if os.path.isdir(libs):
                os.symlink(libs, deps / os.path.basename(libs))
        for extra in os.listdir(os.path.dirname(os.path.dirname(yaml.__file__))):
            if extra.startswith("_yaml"):
                os.symlink(os.path.join(os.path.dirname(os.path.dirname(yaml.__file__)), extra), deps / extra)
    with open(os.path.join(site, "deps.pth"), "w") as f:
        f.write(str(deps) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", os.path.join(env_dir, "bin", "python"), "install", "-q",
                    "--no-deps", "--no-index", "--disable-pip-version-check", wheel], check=True, timeout=300)
    return env_dir


def _wheel(tmp_path, name: str, env: dict) -> str:
    """``pip wheel .`` of a clean copy of the checkout (what ``pip install .`` builds: no build/
    folder or in-place extension of earlier builds), with this venv's setuptools (offline)."""
    src, out = tmp_path / f"{name}-src", tmp_path / name
    skip = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info")
    src.mkdir()
    for top in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(os.path.join(ROOT, top), src / top)
    for pkg in ("ts_core", "ts_integrations"):
        shutil.copytree(os.path.join(ROOT, pkg), src / pkg, ignore=skip)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(out), str(src)], check=True, env=env, timeout=600,
                   cwd=str(tmp_path))
    wheel, = os.listdir(out)
    return str(out / wheel)


def _tree(path: str) -> set:
    return {os.path.join(d, f) for d, _, files in os.walk(path) for f in files if "__pycache__" not in d}


_USE = """
import sys, ts_core, ts_core.native as n
from ts_core import PrecisionDebugger
from ts_core.cli import main
print(ts_core.__file__)
print(n.available())
dbg = PrecisionDebugger(config_path="statistics_mix", dump_path=sys.argv[1])
assert dbg.config.level == "mix"
assert "torch" not in sys.modules
main(["config", "init", "md5"])
try:
    main(["--version"])
except SystemExit:
    pass
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler: the wheel has no extension")
def test_a_fresh_venv_install_builds_and_uses_the_extension(tmp_path):
    env = dict(os.environ)
    wheel = _wheel(tmp_path, "wheel", env)
    assert "-none-any" not in wheel, f"a platform wheel with the extension: {wheel}"
    env_dir = _fresh_env(tmp_path, "venv", wheel)
    site = _site_packages(env_dir)
    home = tmp_path / "home"
    home.mkdir()
    before = _tree(site)
    run_env = {"PATH": os.environ["PATH"], "HOME": str(home), "TSPROBE_QUIET": "1"}
    out = subprocess.run([os.path.join(env_dir, "bin", "python"), "-c", _USE, str(tmp_path / "dump")],
                         cwd=str(tmp_path), env=run_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(site), "the installed copy is imported, not the checkout"
    assert lines[1] == "True"
    assert "native kernels: in use" in out.stdout and site in out.stdout
    assert '"summary_mode": "md5"' in out.stdout                     # tsprobe config init md5
    assert _tree(site) == before and not os.listdir(home), "nothing compiled or written at run time"


@pytest.mark.slow
def test_without_a_compiler_the_install_succeeds_and_runs_the_pure_paths(tmp_path):
    env = dict(os.environ, CC="false", LDSHARED="false")
    wheel = _wheel(tmp_path, "wheel", env)
    env_dir = _fresh_env(tmp_path, "venv", wheel)
    out = subprocess.run([os.path.join(env_dir, "bin", "python"), "-c", _USE, str(tmp_path / "dump")],
                         cwd=str(tmp_path), env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == "False"
    assert "native kernels: not in use (the extension was not built at install" in out.stdout
