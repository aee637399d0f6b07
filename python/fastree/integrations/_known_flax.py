"""The flax code fastree's nnx integration was written and tested against, release by release.

Each entry: a flax release -> {module:qualname -> fingerprint} of every function and class the
tree-mode nodes (``flax_nnx.MIRRORED``) and the graph walks (``flax_nnx_graph.MIRRORED``)
reproduce (:mod:`fastree.integrations._mirrored_code`). Written by
``python -m fastree.integrations._mirrored_code flax`` on each release, after that release passed
the integration's tests natively in ``scripts/release_matrix.py``. Releases whose code is missing
here (0.12.0 to 0.12.6: no graphlib, or an ``unflatten`` without ``recreate_variables``) keep
flax's own functions. docs/porting-library-integrations.md says how to add a release.
"""

KNOWN_CODE: dict[str, dict[str, str]] = {
    "0.12.7, 0.12.8": {
        "flax.nnx.pytreelib:Pytree._pytree__flatten": "ef696acea5a991c8",
        "flax.nnx.pytreelib:Pytree._pytree__flatten_with_paths": "ebe6e41492a1991e",
        "flax.nnx.pytreelib:Pytree._pytree__unflatten": "1c8dff132237b392",
        "flax.nnx.variablelib:_variable_flatten": "c4aefc1ea0262122",
        "flax.nnx.variablelib:_variable_flatten_with_keys": "6195715ba42fe9b4",
        "flax.nnx.variablelib:_variable_unflatten": "e6f124ce13011dda",
        "flax.nnx.variablelib:Variable._new": "b1d40cdd7b64832b",
        "flax.nnx.tracers:TraceState": "7d6e3faa73e25166",
        "flax.nnx.tracers:current_jax_trace": "27b1df94c80606e0",
        "flax.typing:HashableMapping": "e6f6f19e75171828",
        "flax.nnx.graphlib:flatten": "7d9fd93edb286afb",
        "flax.nnx.graphlib:_graph_flatten": "313f8e3d53d7301a",
        "flax.nnx.graphlib:unflatten": "ed95a3e92ec10c43",
        "flax.nnx.graphlib:_graph_unflatten": "1075e9ff69331f2f",
        "flax.nnx.graphlib:_graph_update_dynamic": "9666dfc64885919d",
        "flax.nnx.graphlib:_merge_to_flat_state": "0548e536a2431858",
        "flax.nnx.graphlib:get_node_impl": "0472fd7690cc2950",
        "flax.nnx.graphlib:get_node_impl_for_type": "cd1f6a875c33e824",
        "flax.nnx.graphlib:_flatten_pytree": "8665ed21f21e9760",
        "flax.nnx.graphlib:_unflatten_pytree": "e7ebe1b1165740aa",
        "flax.nnx.graphlib:_get_sorted_leaves": "8845c4ed9fc2ad30",
        "flax.nnx.graphlib:is_node": "7f0c79eb8c53d1dc",
        "flax.nnx.graphlib:NodeDef": "5e9e25c9ecdbb8a4",
        "flax.nnx.graphlib:VariableDef": "7f57778c3ea3c816",
        "flax.nnx.graphlib:NodeRef": "3e8a3ff9345510cb",
        "flax.nnx.graphlib:Static": "2ad7f5b0b7c376ed",
        "flax.nnx.graphlib:GraphDef": "309eff252975a609",
        "flax.nnx.graphlib:IndexMap": "a765e98f0e93684d",
        "flax.nnx.graphlib:PythonRefMap": "0a240be647b97c87",
        "flax.nnx.graphlib:GraphNodeImpl": "62d6e9cf61aafe1e",
        "flax.nnx.graphlib:PytreeNodeImpl": "e9d38bf923fc1744",
        "flax.nnx.graphlib:GenericPytree": "70d1b84e023e3f15",
        "flax.nnx.graphlib:NodeAttr": "7c661699615aace6",
        "flax.nnx.graphlib:LeafAttr": "61c8aa1d44f463a4",
        "flax.nnx.graphlib:DataElem": "010625bfe104409a",
        "flax.nnx.graphlib:StaticElem": "884bc06ea2d9cda9",
        "flax.nnx.graphlib:IndexesPytreeDef": "6ef8007c21bddc42",
        "flax.nnx.pytreelib:Pytree._graph_node_flatten": "24d94e0c2644d283",
        "flax.nnx.pytreelib:Pytree._graph_node_create_empty": "b409bfc74c65e1fd",
        "flax.nnx.pytreelib:Pytree._graph_node_clear": "da2c7d7c9cc2584d",
        "flax.nnx.pytreelib:Pytree._graph_node_init": "ba30711b2dd3d909",
        "flax.nnx.pytreelib:PytreeState": "2a007ce0cfbc55af",
        "flax.nnx.pytreelib:_flatten_pytree_state": "b8ca87c4ec54a360",
        "flax.nnx.pytreelib:_unflatten_pytree_state": "f7c955b72ec8f0ce",
        "flax.nnx.variablelib:Variable.get_raw_value": "9c2bb55aefd5a4bf",
        "flax.nnx.variablelib:Variable.get_metadata": "b23f4ba83f25ab3d",
        "flax.nnx.variablelib:Variable.var_type": "6029e20bc42fa9e1",
        "flax.nnx.variablelib:Variable.__setattr__": "b62c2db6024e2982",
        "flax.nnx.variablelib:Variable.from_metadata": "08572822a2236d1a",
        "flax.nnx.variablelib:Variable.update_from_state": "6308dcb7fb1d7305",
        "flax.nnx.variablelib:Variable.set_raw_value": "1863bb0798144d57",
        "flax.nnx.variablelib:Variable._check_can_update": "832b0f6db2025e37",
        "flax.nnx.statelib:FlatState": "dc066da632fe00d7",
        "flax.nnx.statelib:State.__init__": "f0fd81c31f33b100",
    },
}
