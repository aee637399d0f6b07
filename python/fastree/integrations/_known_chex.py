"""The chex code fastree's chex integration was written and tested against, release by release.

Each entry: a chex release -> {module:qualname -> fingerprint} of what ``chex.MIRRORED``
lists (:mod:`fastree.integrations._mirrored_code`), written by
``python -m fastree.integrations._mirrored_code chex`` after the release passed the
integration's tests natively in ``scripts/release_matrix.py``.
"""

KNOWN_CODE: dict[str, dict[str, str]] = {
    "0.1.90 to 0.1.92": {
        "chex._src.dataclass:register_dataclass_type_with_jax_tree_util": "9142e4eebd3a247d",
        "chex._src.dataclass:_dataclass_unflatten": "d3f561f7b7dd045d",
        "chex._src.dataclass:_flatten_with_path": "93d99ea96fb2c540",
    },
}
