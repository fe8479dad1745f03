"""specjax.sharding: the checks that need one device here, and tests/sharded (8 virtual CPU
devices) in a subprocess, since XLA_FLAGS must be set before JAX starts and this process
has started it already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import sharding
from specjax import methods
from specjax.train.__main__ import main as cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_sharded_suite_on_8_cpu_devices():
    if jax.device_count() >= 8:
        pytest.skip("tests/sharded run in this process")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/sharded"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert " passed" in report and "skipped" not in report, report


@pytest.mark.parametrize("name", [u for u, m in methods.METHODS.items()
                                  if m.runner == "drafter" and u != "ar" and not m.argument])
def test_every_named_drafter_rebuilds_with_partition_spec_leaves(name):
    """`sharding.specs` maps a drafter's leaves to PartitionSpecs, and pytree unflattening re-runs
    its __post_init__: validation there must read static fields only (a Hidden Transfer check of
    its weights' shapes once broke every sharded Hidden Transfer run)."""
    drafter = methods.make(name, sj.load("tiny"))
    specs = sharding.specs(drafter, sharding.make_mesh((1, 1)))
    assert type(specs) is type(drafter)


def test_every_parameter_is_declared():
    """The rules read a leaf's logical axes by its name (`specjax.models.params`, the heads'
    PARAMS): every parameter of the shipped target and heads is declared (d2t is an index map)."""
    from specjax.drafters import PPD, Clover, Eagle, HiddenTransfer, Medusa
    from specjax.layout import portable_layout
    trees = [portable_layout(sj.load("tiny").params)]  # as the rules see it: sj.shard lays panels out row-major
    trees += [cls.load("tiny").params for cls in (Eagle, Medusa, Clover, PPD, HiddenTransfer)]
    names = {path[-1].key for tree in trees for path, _ in jax.tree_util.tree_leaves_with_path(tree)}
    assert names - set(sharding.AXES) <= {"d2t"}


def test_meshes_need_data_and_model_axes():
    params = {"wq": np.zeros((4, 4), np.float32)}
    with pytest.raises(ValueError, match="name their axes 'data' and/or 'model'"):
        sj.shard(params, jax.make_mesh((1,), ("x",)))
    with pytest.raises(TypeError, match="expected a jax.sharding.Mesh"):
        sj.shard(params, (1, 1))
    n = jax.device_count()
    with pytest.raises(ValueError, match=rf"needs {2 * n} devices; there are {n}"):
        sharding.make_mesh((n, 2))
    with pytest.raises(ValueError, match=r"a mesh shape is \[data, model\]"):
        sharding.make_mesh((1, 1, 1))
    assert dict(sharding.make_mesh((-1, 1)).shape) == {"data": n, "model": 1}


def test_cli_mesh_flag_errors(tmp_path, capsys):
    assert cli(["--config", str(tmp_path / "c.toml"), "--mesh", "two,four"]) == 2
    assert "argument --mesh: expected D,M (two integers), got 'two,four'" in capsys.readouterr().err
