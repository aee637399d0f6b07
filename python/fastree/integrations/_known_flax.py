"""The flax code fastree's nnx integration was written and tested against, as data.

One line per mirrored function or class and code: its ``module:qualname``, the fingerprint of its
code (:mod:`fastree.integrations._mirrored_code`), and the flax releases that have that code. A
function whose code changed in a release has one line per code; a release that changes nothing
adds its name to every line. The names are what the tree-mode nodes (``_flax_nnx_shared``: the
Pytree, Variable and State nodes, and the Optimizer ``__getattribute__`` they read through) and
the graph walks (``flax_nnx_graph.MIRRORED``, and per walk ``flax_nnx_graph.WALKS``) reproduce.
Lines are printed by ``python -m fastree.integrations._mirrored_code flax`` on each release, and
added after that release passed the integration's tests natively in ``scripts/release_matrix.py``.

Each graph walk is served where the code of every name it depends on is one release's, so a
release that changes one function turns off only the walks that mirror it. Releases whose code
is missing here keep flax's own functions: 0.12.1 to 0.12.4 (no graphlib), 0.12.5 and 0.12.6 (an
``unflatten`` without ``recreate_variables``, and four more differences). 0.12.10 and 0.12.12
differ from 0.12.8 only in ``Variable._check_can_update`` (``self.hijax`` became ``self.ref``),
which the C update calls unless the Variable's trace is plainly the current one, where both
versions allow the update. 0.12.7's ``extract.check_no_aliases`` is an older function (a
namedtuple per call, ``check_can_update=``) and it has no ``labeled``: there the transforms' alias
check stays flax's (``flax_nnx_graph.WALKS["check_no_aliases"]``), and it has no
``apply_updates`` or ``Updates``: the write-back stays flax's too (``WALKS["apply_updates"]``).
0.12.8's lines for those two are the same source as 0.12.12's (diffed: 0.12.8 does not import
with the JAX the newer releases need). docs/porting-library-integrations.md says how to add a
release.
"""

from ._mirrored_code import known_code_table

CODE = """
flax.nnx.variablelib:_variable_flatten                c4aefc1ea0262122 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:_variable_flatten_with_keys      6195715ba42fe9b4 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:_variable_unflatten              e6f124ce13011dda 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable._new                    b1d40cdd7b64832b 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.tracers:TraceState                           7d6e3faa73e25166 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.tracers:current_jax_trace                    27b1df94c80606e0 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:Pytree._pytree__flatten            ef696acea5a991c8 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:Pytree._pytree__flatten_with_paths ebe6e41492a1991e 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:Pytree._pytree__unflatten          1c8dff132237b392 0.12.7 0.12.8 0.12.10 0.12.12
flax.typing:HashableMapping                           56f038491d0c4841 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:flatten                             b6bbcfcae816b3d8 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:_graph_flatten                      313f8e3d53d7301a 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:unflatten                           0c84e3a11a0879d5 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:_graph_unflatten                    1075e9ff69331f2f 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:_graph_update_dynamic               9666dfc64885919d 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:_merge_to_flat_state                0548e536a2431858 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:get_node_impl                       0472fd7690cc2950 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:get_node_impl_for_type              cd1f6a875c33e824 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:_flatten_pytree                     8665ed21f21e9760 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:_unflatten_pytree                   e7ebe1b1165740aa 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:_get_sorted_leaves                  8845c4ed9fc2ad30 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:is_node                             7f0c79eb8c53d1dc 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:NodeDef                             8b7fcebf2b4dca43 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:VariableDef                         bf44cc8a49fe7e24 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:NodeRef                             28fae76b587ca4dc 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:Static                              ab1b034818a4489f 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:GraphDef                            b6ba3d684f1ffa58 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:IndexMap                            a765e98f0e93684d 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:PythonRefMap                        5fbe02d1c791a9ac 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:GraphNodeImpl                       b99f1c4c1c181b5b 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:PytreeNodeImpl                      8968cdb071104704 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:GenericPytree                       70d1b84e023e3f15 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:NodeAttr                            3789360dbdc04074 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:LeafAttr                            5ee8249c4a1bc1ac 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:DataElem                            b93663fa476efcb0 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:StaticElem                          78b3622879a8014f 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.graphlib:IndexesPytreeDef                    af504caf97d4429a 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:Pytree._graph_node_flatten         24d94e0c2644d283 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:Pytree._graph_node_create_empty    b409bfc74c65e1fd 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:Pytree._graph_node_clear           da2c7d7c9cc2584d 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:Pytree._graph_node_init            ba30711b2dd3d909 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.statelib:_state_flatten_with_keys            ca2b806e21a1d5e0 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.statelib:_state_flatten                      92f973335e5d6e44 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.statelib:_state_unflatten                    43a32be7b5d95fec 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.training.optimizer:Optimizer.__getattribute__ c3c30df86430567e 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:PytreeState                        dd01effda9ede641 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:_flatten_pytree_state              b8ca87c4ec54a360 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.pytreelib:_unflatten_pytree_state            f7c955b72ec8f0ce 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable.get_raw_value           9c2bb55aefd5a4bf 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable.get_metadata            f6440e4f11d81a3c 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable.var_type                6029e20bc42fa9e1 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable.__setattr__             b62c2db6024e2982 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable.from_metadata           08572822a2236d1a 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable.update_from_state       6308dcb7fb1d7305 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable.set_raw_value           6c3d2de9623c8ef6 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable._check_can_update       832b0f6db2025e37 0.12.7 0.12.8
flax.nnx.statelib:FlatState                           dc066da632fe00d7 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.statelib:State.__init__                      554ea4e74c1d62f4 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:Variable._check_can_update       20874c8a3f904bda 0.12.10 0.12.12
flax.nnx.extract:check_no_aliases                     2ad4e50f79d6b0b8 0.12.8 0.12.10 0.12.12
flax.nnx.extract:labeled                              da066a5c6eefac39 0.12.8 0.12.10 0.12.12
flax.nnx.extract:apply_updates                        f2bd2dc44b3aec76 0.12.8 0.12.10 0.12.12
flax.nnx.extract:Updates                              20fad59c55f3c949 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:VariableMeta                     098e50f5b31d1c5d 0.12.7 0.12.8 0.12.10 0.12.12
flax.nnx.variablelib:HijaxVariableMeta                997600b88663dfc7 0.12.7 0.12.8 0.12.10 0.12.12
"""

# {releases with the same code ("0.12.7, 0.12.8"): {module:qualname: fingerprint}}, read from CODE.
KNOWN_CODE: dict[str, dict[str, str]] = known_code_table(CODE)
