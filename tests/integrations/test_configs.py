"""configs/*.yaml are the YAML twins of configs/*.json."""
from __future__ import annotations

import glob
import os

import pytest

from ts_core import build_config

from ._helpers import ROOT

JSONS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.json")))


@pytest.mark.parametrize("json_path", JSONS, ids=[os.path.basename(p) for p in JSONS])
def test_yaml_twin_is_the_same_config(json_path):
    yaml_path = json_path[:-len(".json")] + ".yaml"
    assert os.path.isfile(yaml_path), f"no YAML twin for {os.path.basename(json_path)}"
    assert build_config(yaml_path) == build_config(json_path)


def test_every_yaml_has_a_json_twin():
    for yaml_path in glob.glob(os.path.join(ROOT, "configs", "*.yaml")):
        assert os.path.isfile(yaml_path[:-len(".yaml")] + ".json"), yaml_path
