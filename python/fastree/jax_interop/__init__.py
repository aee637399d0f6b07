"""Everything that talks to JAX: its internals and version rules (``compat``, the only
module that touches JAX internals), the bridge that installs JAX into the core (``bridge``),
key-path entries (``key_makers``), ``tree_util.default_registry`` (``default_registry``) and
``tree_map``'s mismatch explanations (``map_errors``). Internal: the public names are
re-exported by ``fastree`` and ``fastree.tree_util``.
"""
