"""``python -m benchmarks.report RESULTS_JSON``: publish a run already made (see publish.main)."""

from benchmarks.report.publish import main

raise SystemExit(main())
