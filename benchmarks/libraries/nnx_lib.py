"""flax.nnx split/merge: the identity-preserving competitor on the shared-submodule graph."""

from __future__ import annotations

from typing import Any

from benchmarks.data.trees import TreeCase
from benchmarks.libraries.base import Library, TreeApi
from benchmarks.unsupported import Unsupported


def load() -> Library:
    try:
        import flax
        from flax import nnx
    except ImportError as error:
        raise Unsupported(f"flax is not installed ({error})") from None

    def api_for(case: TreeCase) -> TreeApi:
        module = case.extras.get("nnx_module")
        if module is None:
            raise Unsupported("no nnx module for this tree")
        merged = nnx.merge(*nnx.split(module))
        if merged.embed is not merged.unembed:
            raise Unsupported("nnx.split/merge did not keep the tied embedding shared")

        def split_merge(
            module: Any = module, split: Any = nnx.split, merge: Any = nnx.merge
        ) -> Any:
            return merge(*split(module))

        return TreeApi(split_merge=split_merge)

    return Library(
        name="nnx",
        version=f"flax {flax.__version__}",
        ops=frozenset({"split_merge"}),
        api_for=api_for,
    )
