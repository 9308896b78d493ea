"""Modules imported on first use. The MindSpore tests must not import MindSpore while pytest
collects: with torch and MindSpore both imported, ``start()`` without a model cannot tell which
framework to hook, and collection happens before every other test directory runs."""
import importlib


class Lazy:
    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        if attr.startswith("_"):        # pytest probes objects for _pytestfixturefunction, __test__...
            raise AttributeError(attr)
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


ms = Lazy("mindspore")
ops = Lazy("mindspore.ops")
mint = Lazy("mindspore.mint")
nn = Lazy("mindspore.nn")
helpers = Lazy("tests.mindspore.helpers")
