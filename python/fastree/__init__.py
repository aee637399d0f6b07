"""fastree: a C++-accelerated, drop-in replacement for ``jax.tree_util`` and ``jax.tree``.

>>> import fastree.tree_util as tree_util
>>> leaves, treedef = tree_util.tree_flatten({'w': [1, 2], 'b': 3})
>>> leaves, treedef
([3, 1, 2], PyTreeDef({'b': *, 'w': [*, *]}))
>>> tree_util.tree_unflatten(treedef, [x * 10 for x in leaves])
{'b': 30, 'w': [10, 20]}
"""

from . import _jax_bridge

_jax_bridge.install()

from . import tree as tree  # noqa: E402
from . import tree_util as tree_util  # noqa: E402
from ._core import PyTreeDef as PyTreeDef  # noqa: E402
from ._jax_bridge import from_jax as from_jax  # noqa: E402
from ._jax_bridge import to_jax as to_jax  # noqa: E402

__version__ = "0.1.0"

__all__ = ["PyTreeDef", "from_jax", "to_jax", "tree", "tree_util"]
