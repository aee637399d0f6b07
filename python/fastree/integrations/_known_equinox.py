"""The equinox code fastree's equinox integration was written and tested against, release by release.

Each entry: an equinox release -> {module:qualname -> fingerprint} of what ``equinox.MIRRORED``
lists (:mod:`fastree.integrations._mirrored_code`), written by
``python -m fastree.integrations._mirrored_code equinox`` after the release passed the
integration's tests natively in ``scripts/release_matrix.py``.
"""

KNOWN_CODE: dict[str, dict[str, str]] = {
    "0.13.5 to 0.13.8": {
        "equinox._module._flatten:generate_flatten_functions": "91f64f4c587c6d29",
        "equinox._module._flatten:_make_tuple_type": "d345d30ce4440491",
        "equinox._module._flatten:_Missing": "87cbad78db3959c4",
        "equinox._module._flatten:WRAPPER_FIELD_NAMES": "0094d120ebc1ec30",
        "equinox._module._flatten:_GETTER": "a81840cb5a39979b",
        "equinox._module._flatten:_FLAT_WRAPPERS": "90e6e97f4f26ccf8",
        "equinox._module._flatten:_FLAT_CODE": "62bbce3b11bb8c52",
        "equinox._module._flatten:_SET_WRAPPERS": "f13985a1eac7a6b6",
        "equinox._module._flatten:_SET_DYNAMIC": "c9b2f3066ec65290",
        "equinox._module._flatten:_SET_STATIC": "96360d26aa81e7d8",
        "equinox._module._flatten:_UNFLAT_FUNC": "e2f2036a6ce156a6",
        "equinox._module._module:Module.__getattribute__": "198f0be5a0ada3dd",
    },
}
