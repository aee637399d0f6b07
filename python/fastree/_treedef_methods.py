"""``PyTreeDef``'s methods written in Python, attached to the core's type in this one place.

The core (C++) implements ``PyTreeDef``; five of its methods are Python on top of it:

* ``diff`` (``diagnostics/diff.py``), ``fingerprint`` and ``serialize`` (``_serialize.py``);
* ``serialize_using_proto`` and the static ``deserialize_using_proto``: JAX's protocol-buffer
  encoding, through a JAX treedef (``jax_interop/bridge.py``).

:func:`attach` (called once by ``import fastree``) sets them on the type. ``_core.pyi`` declares
them with the rest of the class, and ``tests/test_stubs.py`` checks it against the runtime.

>>> import fastree.tree_util as tu
>>> tu.tree_structure([1, 2]).diff(tu.tree_structure([1]))[0].kind
'num_children'
"""

from __future__ import annotations

from typing import Any

from . import _core, _serialize
from .diagnostics import diff as _diff
from .jax_interop import bridge as _jax_bridge

METHODS: dict[str, Any] = {
    "diff": _diff._treedef_diff,
    "fingerprint": _serialize.fingerprint,
    "serialize": _serialize.serialize,
    "serialize_using_proto": _jax_bridge.serialize_using_proto,
    "deserialize_using_proto": staticmethod(_jax_bridge.deserialize_using_proto),
}
"""Each Python-implemented method of ``PyTreeDef``, by name."""


def attach() -> None:
    """Sets :data:`METHODS` on ``_core.PyTreeDef`` (idempotent)."""
    for name, method in METHODS.items():
        setattr(_core.PyTreeDef, name, method)
