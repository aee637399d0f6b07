"""A dict and a list changed by one thread while seven others walk them (issue 45, step 4).

Thread 0 mutates a shared dict and a shared list a fixed number of times: it adds and removes
keys, replaces values, appends, pops and replaces items. Threads 1-7 meanwhile run tree_flatten,
tree_leaves, tree_map, tree_flatten_with_path and tree_structure on trees holding them. On a
free-threaded build every read of those containers happens inside their critical section or
through PyDict_GetItemRef / PyList_GetItemRef (docs/threads.md, "Borrowed references that
another thread can free"); before that, a walk read entries another thread had just freed.

Each result must be one the container could have given at some moment:

* a dict is gathered in one step, so its keys are some subset of ``KEYS`` in sorted order, each
  with a value that key can hold (``_dict_value_ok``), and the treedef has as many leaves;
* a list is read item by item when the walk reaches each one (as jaxlib reads it), so item i is
  a value position i can hold (``_list_value_ok``), and its length is one the list had.

The one exception a walk may raise is JAX's and fastree's documented one for a list that shrank
under the walk: ``RuntimeError`` "a list in the pytree changed size while it was being
flattened" (csrc/util/pyutils.h, ListShrank). Any other exception, a wrong value, or a crash
(the child process's signal, concurrency_harness.isolated) fails the test. With the GIL the same
workloads run in-process and must pass too.
"""

from __future__ import annotations

import fastree.tree_util as tu
from concurrency_harness import THREADS, isolated, run_threads

KEYS = [f"k{i:02d}" for i in range(24)]  # sorted as JAX sorts str keys
BASE = 32  # the list never has fewer items
EXTRA = 16  # nor more than BASE + EXTRA
MUTATIONS = 20_000
WALKS = 300

SHRANK = "a list in the pytree changed size while it was being flattened"


def _dict_value_ok(key: str, value: object) -> bool:
    i = int(key[1:])
    return value in (i, -i - 1)


def _list_value_ok(position: int, value: object) -> bool:
    return value in (position, -position - 1)


def _fresh():
    shared_dict = {k: int(k[1:]) for k in KEYS[::2]}
    shared_list = list(range(BASE))
    return shared_dict, shared_list


def _mutate(shared_dict: dict, shared_list: list) -> None:
    for step in range(MUTATIONS):
        key = KEYS[step % len(KEYS)]
        i = int(key[1:])
        if step % 3 == 0:
            if key in shared_dict:
                shared_dict.pop(key, None)
            else:
                shared_dict[key] = i
        else:
            shared_dict[key] = -i - 1 if step % 2 else i
        position = step % BASE
        shared_list[position] = -position - 1 if step % 2 else position
        if step % 5 == 0 and len(shared_list) < BASE + EXTRA:
            shared_list.append(len(shared_list))
        elif step % 7 == 0 and len(shared_list) > BASE:
            shared_list.pop()


def _check_dict(got: dict, what: str) -> None:
    assert type(got) is dict, f"{what}: {got!r:.200}"
    assert list(got) == sorted(got) and set(got) <= set(KEYS), f"{what}: keys {list(got)}"
    bad = {k: v for k, v in got.items() if not _dict_value_ok(k, v)}
    assert not bad, f"{what}: values no snapshot held: {bad}"


def _check_list(got: list, what: str) -> None:
    assert type(got) is list, f"{what}: {got!r:.200}"
    assert BASE <= len(got) <= BASE + EXTRA, f"{what}: length {len(got)}"
    bad = [(i, v) for i, v in enumerate(got) if not _list_value_ok(i, v)]
    assert not bad, f"{what}: items no snapshot held: {bad}"


def _check_tree(tree: object, what: str) -> None:
    assert type(tree) is dict and set(tree) == {"d", "l"}, f"{what}: {tree!r:.200}"
    _check_dict(tree["d"], what + " dict")
    _check_list(tree["l"], what + " list")


def _walk_once(tree: dict, step: int, thread: int) -> str:
    """One walk; returns "ok" or "shrank" (the documented RuntimeError)."""
    what = f"thread {thread} step {step}"
    try:
        kind = step % 5
        if kind == 0:
            leaves, treedef = tu.tree_flatten(tree)
            assert treedef.num_leaves == len(leaves), what
            _check_tree(tu.tree_unflatten(treedef, leaves), what + " flatten")
        elif kind == 1:
            leaves = tu.tree_leaves(tree)
            dict_part = tu.tree_leaves(tree["d"])
            list_part = tu.tree_leaves(tree["l"])
            assert all(type(x) is int for x in leaves), what
            assert all(any(_dict_value_ok(k, v) for k in KEYS) for v in dict_part), what
            _check_list(list_part, what + " leaves")
        elif kind == 2:
            _check_tree(tu.tree_map(lambda x: x, tree), what + " map")
        elif kind == 3:
            pairs, treedef = tu.tree_flatten_with_path(tree)
            assert treedef.num_leaves == len(pairs), what
            for path, value in pairs:
                top = path[0].key
                if top == "d":
                    assert _dict_value_ok(path[1].key, value), (what, path, value)
                else:
                    assert _list_value_ok(path[1].idx, value), (what, path, value)
        else:
            treedef = tu.tree_structure(tree)
            assert treedef.num_leaves >= BASE, what
    except RuntimeError as e:
        if SHRANK not in str(e):
            raise
        return "shrank"
    return "ok"


def _mutated_during_walks_workload():
    shared_dict, shared_list = _fresh()
    tree = {"d": shared_dict, "l": shared_list}
    # Single-threaded first: every check passes on the unchanged tree.
    for step in range(5):
        assert _walk_once(tree, step, -1) == "ok"

    def work(k):
        if k == 0:
            _mutate(shared_dict, shared_list)
            return "mutated"
        return [_walk_once(tree, step, k) for step in range(WALKS)]

    results = run_threads(work)
    assert results[0] == "mutated"
    for k in range(1, THREADS):
        assert len(results[k]) == WALKS and set(results[k]) <= {"ok", "shrank"}
    # And the containers are intact afterwards.
    _check_dict(dict(sorted(shared_dict.items())), "final dict")
    _check_list(shared_list, "final list")


def test_dict_and_list_mutated_during_walks():
    isolated(_mutated_during_walks_workload)


def _nested_mutated_workload():
    # The mutated containers deep inside other nodes (tuples, a list of dicts): each level's
    # read takes its own references before the walk descends.
    shared_dict, shared_list = _fresh()
    inner = [shared_dict, {"x": shared_list}]
    tree = ({"a": inner, "b": (shared_list, shared_dict)}, [inner, inner])

    def check(got):
        (top, pair) = got
        assert type(top) is dict and type(pair) is list and len(pair) == 2
        for part in (top["a"], *pair):
            _check_dict(part[0], "nested dict")
            _check_list(part[1]["x"], "nested list")
        _check_list(top["b"][0], "nested list")
        _check_dict(top["b"][1], "nested dict")

    def work(k):
        if k == 0:
            _mutate(shared_dict, shared_list)
            return "mutated"
        shrank = 0
        for step in range(WALKS // 2):
            try:
                if step % 2:
                    check(tu.tree_map(lambda x: x, tree))
                else:
                    leaves, treedef = tu.tree_flatten(tree)
                    check(tu.tree_unflatten(treedef, leaves))
            except RuntimeError as e:
                if SHRANK not in str(e):
                    raise
                shrank += 1
        return shrank

    results = run_threads(work)
    assert results[0] == "mutated"
    assert all(isinstance(r, int) for r in results[1:])


def test_nested_containers_mutated_during_walks():
    isolated(_nested_mutated_workload)


def _unflatten_from_mutated_list_workload():
    # unflatten reads a leaves list item by item (UnflattenIterable): a list another thread
    # appends to and pops from gives a tree of one of its lengths, or JAX's count error.
    treedef = tu.tree_structure(list(range(BASE)))
    leaves = list(range(BASE))

    def work(k):
        if k == 0:
            for step in range(MUTATIONS):
                position = step % (BASE - 1)  # the last one comes and goes
                leaves[position] = -position - 1 if step % 2 else position
                if step % 2:
                    leaves.append(BASE - 1)
                else:
                    leaves.pop()
            return "mutated"
        outcomes = set()
        for _ in range(WALKS):
            try:
                out = tu.tree_unflatten(treedef, leaves)
            except ValueError as e:
                assert "leaves for PyTreeDef" in str(e), e
                outcomes.add("count")
                continue
            _check_list(out, "unflattened")
            outcomes.add("ok")
        return outcomes

    results = run_threads(work)
    assert results[0] == "mutated"
    assert all(r <= {"ok", "count"} for r in results[1:])


def test_unflatten_from_a_mutated_leaves_list():
    isolated(_unflatten_from_mutated_list_workload)
