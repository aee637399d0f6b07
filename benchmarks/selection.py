"""``--only OP/TREE`` matching: shell-style globs on the op name and the tree name."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase


def case_selected(op: str, tree: str, patterns: Sequence[str]) -> bool:
    """True when no pattern is given or one of them matches ``op/tree``.

    ``flatten/transformer*`` matches op and tree separately; a pattern without ``/`` such as
    ``transformer-12`` or ``flatten`` matches either name, so ``--only tuple3`` runs every op on it.
    Tree names carry their leaf kind (``transformer-12@jax``), so ``*@jax`` selects jax leaves,
    while a tree glob without ``@`` matches every leaf kind of that tree.
    """
    if not patterns:
        return True
    for pattern in patterns:
        if "/" in pattern:
            op_glob, tree_glob = pattern.split("/", 1)
            if fnmatchcase(op, op_glob or "*") and _tree_matches(tree, tree_glob or "*"):
                return True
        elif fnmatchcase(op, pattern) or _tree_matches(tree, pattern):
            return True
    return False


def _tree_matches(tree: str, glob: str) -> bool:
    """A glob without "@" ignores the leaf kind: ``tuple3`` also selects ``tuple3@sharded`` when
    ``--leaves sharded`` is what was asked for."""
    if "@" not in glob:
        tree = tree.split("@", 1)[0]
    return fnmatchcase(tree, glob)


def selected_ops(tree: str, ops: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """The ops to run on ``tree``; an empty list means the tree need not be built at all."""
    return [op for op in ops if case_selected(op, tree, patterns)]


def unmatched(patterns: Sequence[str], cases: Sequence[tuple[str, str]]) -> list[str]:
    """The patterns that select none of ``cases`` ((op, tree) pairs the run could time)."""
    return [p for p in patterns if not any(case_selected(op, tree, [p]) for op, tree in cases)]


def nothing_matched(
    patterns: Sequence[str], cases: Sequence[tuple[str, str]], workload_op: str
) -> str:
    """The refusal for ``--only`` patterns that select nothing, with the names that are valid in
    this run: ops, trees and workloads, each once (the cases are every op on every tree)."""
    ops = list(dict.fromkeys(op for op, _tree in cases if op != workload_op))
    trees = list(dict.fromkeys(tree for op, tree in cases if op != workload_op))
    workloads = [tree for op, tree in cases if op == workload_op]
    quoted = ", ".join(f"'{pattern}'" for pattern in patterns)
    lines = [
        f"--only {quoted} matched nothing in this run, so nothing was timed. A pattern is "
        "OP/TREE (shell globs, e.g. 'flatten/transformer*'), or one glob matched against either "
        f"name; workloads answer to op '{workload_op}' (e.g. '{workload_op}/optax*'). Valid names:",
        f"  ops: {', '.join(ops)}",
        f"  trees: {', '.join(trees)}",
    ]
    if workloads:
        lines.append(f"  workloads (op '{workload_op}'): {', '.join(workloads)}")
    lines.append(
        "  (a tree with other than numpy leaves is named TREE@KIND, e.g. tuple3@jax, when --leaves "
        "asks for that kind)"
    )
    return "\n".join(lines)
