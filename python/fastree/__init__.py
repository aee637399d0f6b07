"""fastree: a C++-accelerated, drop-in replacement for ``jax.tree_util`` and ``jax.tree``.

>>> import fastree.tree_util as tree_util
>>> leaves, treedef = tree_util.tree_flatten({'w': [1, 2], 'b': 3})
>>> leaves, treedef
([3, 1, 2], PyTreeDef({'b': *, 'w': [*, *]}))
>>> tree_util.tree_unflatten(treedef, [x * 10 for x in leaves])
{'b': 30, 'w': [10, 20]}
"""

from .jax_interop import bridge as _jax_bridge

_jax_bridge.install()

from . import tree as tree  # noqa: E402
from . import tree_util as tree_util  # noqa: E402
from ._core import PyTreeDef as PyTreeDef  # noqa: E402
from .jax_interop.bridge import from_jax as from_jax  # noqa: E402
from .jax_interop.bridge import to_jax as to_jax  # noqa: E402

# Static metadata: aux_data checks and settings; PyTreeDef's Python-implemented methods (diff,
# fingerprint, serialize, JAX's proto encoding), attached in one place.
from . import _config, _treedef_methods  # noqa: E402

_config.install()
_treedef_methods.attach()

from .diagnostics.audit import AuditEntry as AuditEntry  # noqa: E402
from .diagnostics.audit import AuditReport as AuditReport  # noqa: E402
from .diagnostics.audit import audit as audit  # noqa: E402
from .diagnostics.aux import AuxDataWarning as AuxDataWarning  # noqa: E402
from ._config import config as config  # noqa: E402
from ._config import strict_aux as strict_aux  # noqa: E402
from .diagnostics.diff import StructureDiff as StructureDiff  # noqa: E402
from .diagnostics.diff import structure_diff as structure_diff  # noqa: E402
from ._serialize import deserialize as deserialize  # noqa: E402

# Identity-preserving nodes: the aliasing diagnostic and jit over one DAG of all arguments.
from ._identity import SharedObject as SharedObject  # noqa: E402
from ._identity import find_shared as find_shared  # noqa: E402
from ._jit import jit as jit  # noqa: E402
from ._registration import register_attribute_node as register_attribute_node  # noqa: E402

from . import integrations as integrations  # noqa: E402

# Routing jax.tree_util / jax.tree to fastree for the whole process.
from ._install import install as install  # noqa: E402
from ._install import installed as installed  # noqa: E402
from ._install import installed_functions as installed_functions  # noqa: E402
from ._install import is_installed as is_installed  # noqa: E402
from ._install import original as original  # noqa: E402
from ._install import uninstall as uninstall  # noqa: E402

# The one place the version is written: pyproject.toml reads it from here when building.
__version__ = "0.1.0"

__all__ = [
    "AuditEntry",
    "AuditReport",
    "AuxDataWarning",
    "PyTreeDef",
    "SharedObject",
    "StructureDiff",
    "audit",
    "config",
    "deserialize",
    "find_shared",
    "from_jax",
    "install",
    "installed",
    "installed_functions",
    "is_installed",
    "integrations",
    "jit",
    "original",
    "register_attribute_node",
    "strict_aux",
    "structure_diff",
    "to_jax",
    "tree",
    "tree_util",
    "uninstall",
]

# FASTREE_INSTALL=1 with `import fastree` before any `import jax`: the start-up hook saw JAX
# imported by fastree's own import above and left the install to this point.
_autoinstall = __import__("sys").modules.get("_fastree_autoinstall")
if _autoinstall is not None and _autoinstall._deferred:
    _autoinstall._deferred = False
    install()
del _autoinstall
