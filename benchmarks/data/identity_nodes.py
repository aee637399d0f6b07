"""Module-like node types for fastree's identity-preserving ("PyDAG") benchmarks.

Two families of the same dataclasses: ``DAG`` registered with ``preserve_identity=True`` and
``PLAIN`` registered the ordinary way. Both go through ``register_dataclass``, so the only
difference the benchmarks see is identity tracking, not a Python callback per node.

* ``shared_model``: the fastree twin of ``nnx_models.shared_submodule_model`` (an embedding tied
  at input and output, ``SHARED_BLOCKS`` blocks of two linear layers), for split_merge.
* ``module_transformer``: transformer-12's parameters as nested modules with no sharing at all,
  built once per family over the same leaf objects, for identity_copy (what identity tracking
  costs a tree that does not need it).

Registration needs fastree; it happens on first use so the suite still runs without it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from types import SimpleNamespace
from typing import Any

from benchmarks.data.leaves import LeafFactory
from benchmarks.unsupported import Unsupported

SHARED_BLOCKS = 100
"""Blocks in the shared-graph model (nnx_models builds the same number)."""


def _module_classes() -> SimpleNamespace:
    """A fresh set of module dataclasses (unregistered): one call per family."""

    @dataclasses.dataclass(eq=False)
    class Linear:
        kernel: Any
        bias: Any

    @dataclasses.dataclass(eq=False)
    class Embed:
        embedding: Any

    @dataclasses.dataclass(eq=False)
    class Block:
        fc1: Any
        fc2: Any

    @dataclasses.dataclass(eq=False)
    class SharedModel:
        embed: Any
        blocks: Any
        unembed: Any

    @dataclasses.dataclass(eq=False)
    class LayerNorm:
        scale: Any
        bias: Any

    @dataclasses.dataclass(eq=False)
    class Attention:
        query: Any
        key: Any
        value: Any
        out: Any

    @dataclasses.dataclass(eq=False)
    class Mlp:
        fc1: Any
        fc2: Any

    @dataclasses.dataclass(eq=False)
    class Layer:
        attention: Any
        mlp: Any
        ln1: Any
        ln2: Any

    @dataclasses.dataclass(eq=False)
    class Transformer:
        embedding: Any
        layers: Any
        final_norm: Any

    classes = (Linear, Embed, Block, SharedModel, LayerNorm, Attention, Mlp, Layer, Transformer)
    return SimpleNamespace(**{cls.__name__: cls for cls in classes})


@functools.cache
def families() -> tuple[SimpleNamespace, SimpleNamespace]:
    """(DAG, PLAIN): the classes registered with and without preserve_identity."""
    from benchmarks.data.fastree_import import try_import_tree_util

    tu = try_import_tree_util()
    if tu is None:
        raise Unsupported("fastree did not import: no identity-preserving node types")
    if "preserve_identity" not in inspect.signature(tu.register_dataclass).parameters:
        raise Unsupported("this fastree has no preserve_identity registration")
    dag, plain = _module_classes(), _module_classes()
    for family, preserve in ((dag, True), (plain, False)):
        for cls in vars(family).values():
            # Renamed so reprs and reports say which family a node belongs to.
            cls.__qualname__ = f"{'Dag' if preserve else 'Plain'}{cls.__name__}"
            tu.register_dataclass(cls, preserve_identity=preserve)
    return dag, plain


def shared_model(leaf: LeafFactory) -> Any:
    """Embedding tied at input and output around SHARED_BLOCKS blocks of two Linear layers."""
    dag, _plain = families()

    def linear() -> Any:
        return dag.Linear(leaf((2, 2)), leaf((2,)))

    embed = dag.Embed(leaf((4, 2)))
    blocks = [dag.Block(linear(), linear()) for _ in range(SHARED_BLOCKS)]
    return dag.SharedModel(embed=embed, blocks=blocks, unembed=embed)


def module_transformer(params: dict[str, Any]) -> tuple[Any, Any]:
    """(plain, identity-preserving) modules holding ``trees.transformer_params``' leaves."""
    dag, plain = families()
    return _wrap(plain, params), _wrap(dag, params)


def _wrap(family: SimpleNamespace, params: dict[str, Any]) -> Any:
    """transformer_params' dicts as modules of ``family`` (the leaf objects are reused)."""

    def dense(d: dict[str, Any]) -> Any:
        return family.Linear(d["kernel"], d["bias"])

    def norm(d: dict[str, Any]) -> Any:
        return family.LayerNorm(d["scale"], d["bias"])

    layers = [
        family.Layer(
            attention=family.Attention(
                *(dense(layer["attention"][k]) for k in ("query", "key", "value", "out"))
            ),
            mlp=family.Mlp(dense(layer["mlp"]["fc1"]), dense(layer["mlp"]["fc2"])),
            ln1=norm(layer["ln1"]),
            ln2=norm(layer["ln2"]),
        )
        for layer in params["layers"]
    ]
    return family.Transformer(
        embedding=family.Embed(params["embedding"]["embedding"]),
        layers=layers,
        final_norm=norm(params["final_norm"]),
    )
