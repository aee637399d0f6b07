"""One process of the end-to-end workloads: ``python -m benchmarks.measure.child``.

The parent (``benchmarks.measure.workloads``) starts this module twice: plain, and under ``python
-m fastree.run`` so that fastree is installed into JAX before any workload imports a library. It
then conducts both, one JSON request per line on stdin, one JSON answer per line on stdout:

- ``{"cmd": "mode"}``: ``{"installed": bool}``, whether fastree is installed here;
- ``{"cmd": "build", "name": ..., "size": ..., "target_ns": ...}``: builds the workload, calls
  it twice (compilation, library nodes' first-instance checks), fingerprints the result and
  calibrates a loop; answers ``{"size", "fingerprint", "loops"}`` or ``{"not_run": why}``;
- ``{"cmd": "time", "name": ...}``: times the built workload now; answers ``{"ns": per call}``,
  the fastest of its passes, or ``{"not_run": why}`` if the call raised. A workload with a floor
  (``Prepared.floor``) times the floor in the same passes, taking turns with the call, and
  answers ``{"ns", "floor_ns"}``: the two are moments apart, in the same process.

Each answer line starts with ANSWER_PREFIX: anything else a library or an editable build's
rebuild prints to stdout is not mistaken for an answer. The two processes take turns, so each
timing in one sits moments apart from its partner in the other, while each process keeps its
own imports, registrations and caches.
"""

from __future__ import annotations

import gc
import json
import sys
from typing import Any

from benchmarks.measure.timing import PASSES, calibrate, time_loop
from benchmarks.unsupported import Unsupported
from benchmarks.workloads import WORKLOADS
from benchmarks.workloads.base import Prepared

ANSWER_PREFIX = "fastree-bench-answer: "


def installed_here() -> bool:
    fastree = sys.modules.get("fastree")
    return bool(fastree is not None and getattr(fastree, "is_installed", lambda: False)())


class Server:
    """The built workloads of this process, and the answer to each request."""

    def __init__(self) -> None:
        self.built: dict[str, tuple[Prepared, int, int]] = {}
        """name -> (prepared call, loops, passes)."""
        self.floor_loops: dict[str, int] = {}
        """name -> the floor's loops, for a workload with a floor."""

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        command = request.get("cmd")
        if command == "mode":
            return {"installed": installed_here()}
        if command == "build":
            return self.build(request["name"], request["size"], request["target_ns"])
        if command == "time":
            return self.time(request["name"])
        return {"not_run": f"unknown request {request!r}"}

    def build(self, name: str, size: str, target_ns: int) -> dict[str, Any]:
        workload = next((w for w in WORKLOADS if w.name == name), None)
        if workload is None:
            return {"not_run": f"no workload named {name!r}"}
        try:
            prepared = workload.build(workload.sizes[size])
        except Unsupported as reason:
            return {"not_run": str(reason)}
        except Exception as error:  # noqa: BLE001 - a library's API moved: say so, run the rest
            return {"not_run": f"building it raised {type(error).__name__}: {error}"}
        # With a floor, the call and the floor share the turn's time.
        share = max(1, target_ns // (PASSES * (1 if prepared.floor is None else 2)))
        try:
            result = prepared.call()
            prepared.call()  # a second warm-up: library nodes check their first instances
            fingerprint = prepared.fingerprint(result)
            loops = calibrate(prepared.call, (), share)
            # A call that alone fills the target runs once per round (as in timing.measure).
            once = loops == 1 and time_loop(prepared.call, (), 1) >= target_ns
            if prepared.floor is not None:
                prepared.floor()
                self.floor_loops[name] = calibrate(prepared.floor, (), share)
        except Exception as error:  # noqa: BLE001 - reported as this mode's failure
            return {"not_run": f"raised {type(error).__name__}: {error}"}
        self.built[name] = (prepared, loops, 1 if once else PASSES)
        return {"size": prepared.size, "fingerprint": fingerprint, "loops": loops}

    def time(self, name: str) -> dict[str, Any]:
        prepared, loops, passes = self.built[name]
        if prepared.floor is not None:
            return self.time_with_floor(name)
        gc.collect()
        gc.disable()
        try:
            fastest = min(time_loop(prepared.call, (), loops) / loops for _ in range(passes))
        except Exception as error:  # noqa: BLE001 - reported as this mode's failure
            return {"not_run": f"raised {type(error).__name__}: {error}"}
        finally:
            gc.enable()
        return {"ns": fastest}

    def time_with_floor(self, name: str) -> dict[str, Any]:
        """The call and its floor, PASSES loops each, taking turns (which goes first
        alternating from pass to pass); each one's fastest pass."""
        prepared, loops, _passes = self.built[name]
        assert prepared.floor is not None
        timed = {"ns": (prepared.call, loops), "floor_ns": (prepared.floor, self.floor_loops[name])}
        fastest = dict.fromkeys(timed, float("inf"))
        gc.collect()
        gc.disable()
        try:
            for index in range(PASSES):
                for key in sorted(timed, reverse=index % 2 == 1):
                    fn, count = timed[key]
                    fastest[key] = min(fastest[key], time_loop(fn, (), count) / count)
        except Exception as error:  # noqa: BLE001 - reported as this mode's failure
            return {"not_run": f"raised {type(error).__name__}: {error}"}
        finally:
            gc.enable()
        return fastest


def serve(lines: Any = sys.stdin, out: Any = sys.stdout) -> None:
    server = Server()
    for line in lines:
        if line.strip():
            out.write(ANSWER_PREFIX + json.dumps(server.answer(json.loads(line))) + "\n")
            out.flush()


if __name__ == "__main__":
    serve()
