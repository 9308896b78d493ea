"""MindSpore tests run real PyNative on CPU; without MindSpore installed they are not collected."""
import importlib.util

import pytest

if importlib.util.find_spec("mindspore") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    @pytest.fixture(autouse=True)
    def _pynative_cpu():
        import mindspore as ms

        from ts_core import PrecisionDebugger
        from ts_core.backends.mindspore._runtime import warm_up

        ms.set_device("CPU")
        ms.set_context(mode=ms.PYNATIVE_MODE)
        warm_up()
        yield
        current = PrecisionDebugger.current()
        if current is not None:      # a failed test must not leave patches behind
            current.close()
