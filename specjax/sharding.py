"""specjax on a device mesh: tensor parallel over a 'model' axis, batch over a 'data' axis.

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    model = sj.shard(model, mesh)          # or sj.load(path, mesh=mesh)
    out = sj.generate(model, prompts)      # the same jitted loop, partitioned by XLA (GSPMD)

Parameters are laid out Megatron-style by their declared logical axes (`specjax.models.params`,
and each head's `PARAMS`), found by leaf name: the attention and MLP input projections (wq, wk,
wv, w_gate, w_up, their biases) split their output dim over 'model', the output projections
(wo, w_down) their input dim, the embedding and LM head their vocabulary; norms and everything
undeclared stay replicated. Attention weights split in whole heads; a dim that does not split
evenly over the axis stays replicated (e.g. 2 kv heads on a 4-way 'model' axis). The stacked
layer axis is never split. With `fsdp=True` (training) the model width of a matrix ("embed")
also splits over 'data'. Meshes get Auto axes, so XLA propagates the layout through the
library's jitted code unchanged. `generate` traces its loop under the model's mesh
(`jax.set_mesh`): the KV caches are pinned to batch over 'data' and kv heads over 'model', and
the Pallas kernels give way to their XLA references, which XLA partitions (a kernel is one
device's code).

Multi-host: call `initialize_distributed()` (or `jax.distributed.initialize()`) first in every
process, build the mesh over `jax.devices()`, load with `sj.load(checkpoint, mesh=mesh)` (each
process reads its own shards) and pass every process the same prompts or batches.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from jax.tree_util import DictKey

from pallas_kernels.matmul import PanelWeight
from specjax import heads
from specjax.models import KVCache, params
from specjax.models.layer_list import LayerList

DATA, MODEL = "data", "model"

# logical axis -> the mesh axis it splits over (FSDP: with fsdp=True only)
RULES = {"vocab": MODEL, "q_heads": MODEL, "kv_heads": MODEL, "mlp": MODEL}
FSDP_RULES = {"embed": DATA}
_IN_HEADS = {"q_heads", "kv_heads"}  # split in whole heads of head_dim
# every declared parameter name -> its logical axes, counted from the last dim (so that stacked
# layers [L, ...], single layers and a QuantizedWeight's fields read alike)
AXES = params.axes_by_name(params.LLAMA, *heads.DECLARED)


def make_mesh(shape) -> Mesh:
    """A ('data', 'model') mesh of `shape` = (d, m) over all devices; d = -1 takes the rest."""
    shape = tuple(int(s) for s in shape)
    n = jax.device_count()
    if len(shape) != 2 or shape[1] < 1 or shape[0] == 0 or shape[0] < -1:
        raise ValueError(f"a mesh shape is [data, model] (data may be -1), got {list(shape)}")
    if shape[0] == -1:
        shape = (n // shape[1], shape[1])
    if shape[0] * shape[1] != n:
        raise ValueError(f"mesh {list(shape)} needs {shape[0] * shape[1]} devices; there are {n}")
    return jax.make_mesh(shape, (DATA, MODEL), axis_types=(AxisType.Auto,) * 2)


def _checked(mesh: Mesh) -> Mesh:
    """`mesh` with Auto axes (propagated by XLA through unannotated code), named for specjax."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"expected a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not set(mesh.axis_names) <= {DATA, MODEL}:
        raise ValueError(f"specjax meshes name their axes {DATA!r} and/or {MODEL!r}, got "
                         f"{mesh.axis_names}, e.g. jax.make_mesh((2, 4), ('data', 'model'))")
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _size(mesh, axis: str) -> int:
    return dict(mesh.shape).get(axis, 1)


def _splits(n: int, unit: int, ways: int) -> bool:
    return ways > 1 and n % unit == 0 and (n // unit) % ways == 0


def _spec(path, shape, mesh, head_dim, fsdp) -> P:
    names = [k.key for k in path if isinstance(k, DictKey)]
    axes = AXES.get(names[-1], ()) if names else ()
    spec = [None] * len(shape)
    for dim, axis in zip(range(-1, -len(shape) - 1, -1), reversed(axes)):
        if axis in RULES:
            # whole heads for plain weights; a QuantizedWeight's data/scales (path ends in a field) by size
            unit = head_dim if head_dim and axis in _IN_HEADS and isinstance(path[-1], DictKey) else 1
            if _splits(shape[dim], unit, _size(mesh, RULES[axis])):
                spec[dim] = RULES[axis]
        elif fsdp and axis in FSDP_RULES and len(shape) >= 2 and _splits(shape[dim], 1, _size(mesh, FSDP_RULES[axis])):
            spec[dim] = FSDP_RULES[axis]
    return P(*spec)


def _head_dim(node) -> int | None:
    """The head size of a node whose static config has one (a Model, an EAGLE drafter), else None."""
    head_dim = getattr(getattr(node, "config", None), "head_dim", None)
    return head_dim if isinstance(head_dim, int) else None


def specs(tree, mesh, *, head_dim: int | None = None, fsdp: bool = False):
    """The PartitionSpec of every array (ShapeDtypeStruct, tracer) in `tree` on `mesh` (a Mesh
    or an AbstractMesh), by the rules above. Nodes whose config has a head_dim (Models, EAGLE
    drafters) split attention in their own heads; `head_dim` does it for bare params dicts."""
    def leaf(path, x, hd):
        return _spec(path, np.shape(x), mesh, hd, fsdp)

    def node(path, x):
        hd = _head_dim(x)
        if hd is None:
            return leaf(path, x, head_dim)
        return jax.tree_util.tree_map_with_path(lambda p, y: leaf(path + p, y, hd), x)

    return jax.tree_util.tree_map_with_path(node, tree, is_leaf=lambda x: _head_dim(x) is not None)


def shardings(tree, mesh: Mesh, *, head_dim: int | None = None, fsdp: bool = False):
    """`specs` as NamedShardings on `mesh`."""
    mesh = _checked(mesh)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs(tree, mesh, head_dim=head_dim, fsdp=fsdp),
                        is_leaf=lambda x: isinstance(x, P))


def shard(tree, mesh: Mesh, *, head_dim: int | None = None, fsdp: bool = False):
    """Lay a Model, a drafter, params or optimizer state out over `mesh` (see `specs`). Float
    weights in column panels (`sj.load`'s layout for the CPU kernel) go back to row-major and
    LayerLists (its layout on a GPU) to stacks: on a mesh XLA's partitioned code runs, and
    the rules read row-major axes of stacked layers."""
    laid_out = lambda x: isinstance(x, (PanelWeight, LayerList))
    tree = jax.tree.map(lambda x: x.untiled() if laid_out(x) else x, tree, is_leaf=laid_out)
    return jax.device_put(tree, shardings(tree, mesh, head_dim=head_dim, fsdp=fsdp))


def constrain(tree, *, head_dim: int | None = None, fsdp: bool = False):
    """Inside jit: pin `tree` to the layout of `specs` when a mesh is set (`jax.set_mesh`), so
    that a step's outputs keep its inputs' layout; unchanged otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return tree
    return jax.lax.with_sharding_constraint(tree, specs(tree, mesh, head_dim=head_dim, fsdp=fsdp))


def mesh_of(tree) -> Mesh | None:
    """The mesh `tree`'s arrays are laid out on (by `shard`), or None."""
    for x in jax.tree.leaves(tree):
        s = getattr(x, "sharding", None)
        if isinstance(s, NamedSharding):
            return _checked(s.mesh)
    return None


def pad_batch(mesh: Mesh | None, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Host arrays [B, ...] with the last row repeated until B splits over 'data'. A repeated
    prompt decodes exactly like its original, so the copies never lengthen the loop; drop
    rows B: of the results."""
    pad = -len(arrays[0]) % (_size(mesh, DATA) if mesh is not None else 1)
    return tuple(np.concatenate([a, np.repeat(a[-1:], pad, axis=0)]) for a in arrays)


def shard_batch(mesh: Mesh | None, x) -> jax.Array:
    """A host batch [B, ...] split over 'data' (replicated over 'model'); on one device without
    a mesh. Multi-host: every process passes the same whole batch and places its own shards."""
    if mesh is None:
        return jnp.asarray(x)
    x, mesh, d = np.asarray(x), _checked(mesh), _size(mesh, DATA)
    if len(x) % d:
        raise ValueError(f"a batch of {len(x)} rows does not split over the mesh's {d}-way "
                         f"{DATA!r} axis; use a multiple of {d} (or pad_batch)")
    where = NamedSharding(mesh, P(DATA if d > 1 else None))
    return jax.make_array_from_callback(x.shape, where, lambda index: x[index])


def abstract(tree, target=None):
    """ShapeDtypeStructs of `tree` with the shardings `target` (a matching tree), else each
    array's own, else the first local device's: what orbax restores into, what `lower` expects."""
    local = SingleDeviceSharding(jax.local_devices()[0])
    if target is None:
        target = jax.tree.map(lambda x: getattr(x, "sharding", None) or local, tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, target)


def constrain_caches(tree):
    """Pin every KVCache in `tree` to batch over 'data' and kv heads over 'model' (each where it
    divides) when a mesh is set (`jax.set_mesh`); unchanged otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return tree

    def axis(n, name):
        return name if _splits(n, 1, _size(mesh, name)) else None

    def pin(c):
        if not isinstance(c, KVCache):
            return c
        _, b, _, kv, _ = c.k.shape
        kv_spec = P(None, axis(b, DATA), None, axis(kv, MODEL), None)
        put = jax.lax.with_sharding_constraint
        return KVCache(put(c.k, kv_spec), put(c.v, kv_spec), put(c.lengths, P(axis(b, DATA))))

    return jax.tree.map(pin, tree, is_leaf=lambda x: isinstance(x, KVCache))


def use_mesh(mesh: Mesh | None):
    """`jax.set_mesh(mesh)` (with Auto axes) as a context, or nothing without a mesh."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(_checked(mesh))


def to_host(tree):
    """`jax.device_get`, gathering arrays that span several hosts."""
    if all(x.is_fully_addressable for x in jax.tree.leaves(tree)):
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def initialize_distributed() -> None:
    """`jax.distributed.initialize()`: auto-detected on Cloud TPU, SLURM and Open MPI; elsewhere
    from JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES, JAX_PROCESS_ID."""
    env = os.environ
    jax.distributed.initialize(
        num_processes=int(env["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in env else None,
        process_id=int(env["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in env else None)


__all__ = ["DATA", "MODEL", "abstract", "constrain", "constrain_caches", "initialize_distributed",
           "make_mesh", "mesh_of", "pad_batch", "shard", "shard_batch", "shardings", "specs", "to_host",
           "use_mesh"]
