"""How sure the suite is of each figure: the median of paired round ratios, with an interval.

Every figure compares two things timed in the same rounds: fastree and a peer library in one
process (``timing.measure``), or a workload plain and installed in child processes that alternate
(``workloads``). Each round gives one ratio, peer time / fastree time (or plain / installed),
from two timings taken moments apart, so a slow spell of a shared machine that hits both sides of
a round cancels out of that round's ratio instead of being charged to whichever side ran in it.

The figure is the median of the round ratios. Its interval is the distribution-free confidence
interval of a median from order statistics (the sign-test interval): with n rounds, the k-th
smallest and k-th largest ratio bound the true median with probability
1 - 2 P(Binomial(n, 1/2) < k), whatever the distribution of the ratios, as long as the rounds are
independent. One disturbed round moves an end of the interval by at most one rank, not the figure.
A figure whose interval contains 1.0 reads as "same": the rounds do not tell the two apart.

Why these statistics and not a timing library's:

- pyperf, the CPython project's benchmark toolkit, times one benchmark at a time in worker
  processes of its own and reports mean +- standard deviation. It cannot interleave fastree and a
  peer in the same rounds, which is what cancels a shared machine's drifts, its mean and standard
  deviation are pulled by the long-tailed outliers such a machine produces, and its defaults
  (20 worker processes per benchmark) would take hours over the suite's ~1,000 cells. Its ideas
  that matter here are kept: calibrated inner loops, warm-ups, several independent values.
- A bootstrap interval (``scipy.stats.bootstrap``) of a median of 5-15 rounds is coarse (a
  resampled median takes only a few values) and covers less than it claims at such sizes; the
  order-statistic interval is exact at every n.

Several runs of the suite, each in its own processes, are pooled cell by cell with
``across_runs``: the median of the runs' figures, with an interval that covers where a new run's
figure lands (the spread between runs), not only one run's rounds. That is what the published run
quotes (``python -m benchmarks --runs N``, ``benchmarks.measure.pooling``).

The interval's ranks come from SciPy (``scipy.stats.quantile_test``, and ``binom`` for the
coverage), which JAX itself depends on: no new dependency, and no hand-written distribution code.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.90
"""The confidence asked of every interval. With fewer than 5 rounds it cannot be reached: the
interval is then the rounds' whole range and its (lower) confidence is reported with it."""

PREDICTION_CONFIDENCE = 0.95
"""The probability asked of a pooled run's intervals (``across_runs``) that one more run's figure
lands inside. Above CONFIDENCE because a reader takes the published intervals as a promise about
the run they make, cell by cell: aimed at 90%, a new run landed inside 87.9-93.4% of them (six
new runs against four published ones), short of 90% about as often as not."""

PRIOR_DF = 4
"""The weight, in degrees of freedom, of the spread typical of the suite's cells when a cell's own
spread between runs is estimated from a handful of runs (``across_runs``'s ``prior``)."""

MIN_ROUNDS_FOR_VERDICT = 3
"""Below this, the interval covers the median with at most 50% confidence: every figure reads
"same", whatever its value."""

SAME, FASTER, SLOWER = "same", "faster", "slower"
"""Verdicts from the baseline's side: "faster" when the whole interval is above 1.0 (the other
side took longer in every plausible reading), "slower" when it is below, "same" otherwise."""


@dataclass(frozen=True)
class Estimate:
    """A ratio measured over paired rounds."""

    value: float
    """Median of the per-round ratios."""
    low: float
    high: float
    """Interval ends: the order statistics that cover the median with ``confidence``."""
    rounds: int
    confidence: float
    """Probability that [low, high] covers the true median ratio (at least CONFIDENCE when there
    were 5 rounds or more); pooled over runs (``across_runs``), that it covers a new run's value."""
    runs: int = 1
    """Runs, made in separate processes, whose estimates were pooled (``across_runs``)."""

    @property
    def verdict(self) -> str:
        if self.rounds < MIN_ROUNDS_FOR_VERDICT:
            return SAME
        return verdict(self.low, self.high)

    @property
    def half_width(self) -> float:
        """Relative half-width on a log scale: sqrt(high / low) - 1 (0.05 is about +-5%)."""
        return math.sqrt(self.high / self.low) - 1.0


def verdict(low: float | None, high: float | None) -> str:
    """FASTER / SLOWER / SAME for an interval of (other time / baseline time)."""
    if low is None or high is None:
        return SAME
    if low > 1.0:
        return FASTER
    if high < 1.0:
        return SLOWER
    return SAME


@functools.cache
def interval_ranks(rounds: int, confidence: float = CONFIDENCE) -> tuple[int, int, float]:
    """(low index, high index, coverage) into the sorted ratios of ``rounds`` rounds.

    The narrowest symmetric pair of order statistics whose coverage reaches ``confidence``, from
    ``scipy.stats.quantile_test`` asked about 0, 1, ..., n-1 (so the interval it returns is the
    pair of indices); its whole range when ``rounds`` is too small for ``confidence``.
    """
    import numpy as np
    from scipy import stats

    if rounds < 1:
        raise ValueError("an interval needs at least one round")
    if rounds == 1:
        return 0, 0, 0.0
    ci = stats.quantile_test(np.arange(rounds, dtype=float), q=0, p=0.5).confidence_interval(
        confidence_level=confidence
    )
    if math.isnan(ci.low) or math.isnan(ci.high):
        low, high = 0, rounds - 1  # too few rounds: the whole range, at its own coverage
    else:
        low, high = int(ci.low), int(ci.high)
    # [sorted[low], sorted[high]] misses the median when at most `low` ratios fall below it (or,
    # symmetrically, above it): each side has probability P(Binomial(n, 1/2) <= low).
    coverage = 1.0 - 2.0 * float(stats.binom.cdf(low, rounds, 0.5))
    return low, high, coverage


def estimate(ratios: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """The median of ``ratios`` (one per round) with its order-statistic interval."""
    ordered = sorted(ratios)
    low, high, coverage = interval_ranks(len(ordered), confidence)
    return Estimate(
        value=statistics.median(ordered),
        low=ordered[low],
        high=ordered[high],
        rounds=len(ordered),
        confidence=coverage,
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def paired(numerators: Sequence[float], denominators: Sequence[float]) -> Estimate:
    """estimate() of numerator[i] / denominator[i], round by round."""
    return estimate([n / d for n, d in zip(numerators, denominators, strict=True)])


# ------------------------------------------------------------------------------------------------
# several runs, pooled


@dataclass(frozen=True)
class Spread:
    """How far one cell's figure moves between runs, typically, over a suite's cells: the
    standard deviation of a cell's log figure between runs (``typical_spread``)."""

    sd: float
    df: float = PRIOR_DF


def typical_spread(cells: Sequence[Sequence[float]]) -> Spread | None:
    """The spread typical of ``cells`` (each the figures one cell had in the runs pooled): the
    median, over the cells with two runs or more, of the variance of their log figures. None
    when no cell has two runs."""
    variances = [
        statistics.variance([math.log(value) for value in values])
        for values in cells
        if len(values) >= 2
    ]
    return Spread(math.sqrt(statistics.median(variances))) if variances else None


def across_runs(
    runs: Sequence[Estimate],
    confidence: float = PREDICTION_CONFIDENCE,
    prior: Spread | None = None,
) -> Estimate:
    """One cell's figure pooled from runs made in separate processes: where a new run lands.

    A run's interval (``estimate``) covers its own rounds' median, under its own load; a run made
    later, in another process, shifts by more than that (where its memory landed, what else the
    machine ran), so a second run's figure falls outside the first's interval in about half the
    cells. The pooled figure answers the question a reader asks instead: where will my run's
    figure land?

    - value: the median of the runs' values (one disturbed run moves it by at most one rank);
    - interval: the hull of two things, so it is never narrower than either:
      - a prediction interval for one more run's value from the runs' values, on the log scale
        (ratios multiply): ``mean ± t(k-1) · s · sqrt(1 + 1/k)``, with k runs, s the standard
        deviation of their log values and t Student's quantile for ``confidence``. It covers the
        value of a new run of the same kind on the same stack with probability ``confidence``
        when the log values are roughly normal; s holds both the spread between runs and each
        run's own rounds' noise, since each run's value carries both;
      - every run's own interval: with few runs, s can come out small by chance (three runs that
        happen to agree); each run's interval keeps its rounds' noise in the pooled one, and with
        it the range of the runs' values;
      - with ``prior`` (the spread typical of the suite's cells, ``typical_spread``), the same
        prediction with s moderated towards it: ``s'^2 = (d0 * prior^2 + (k-1) * s^2) / (d0 +
        k-1)`` and t on ``d0 + k-1`` degrees of freedom (d0 = ``prior.df``), the shrinkage of
        per-cell variances that few replicates call for (Smyth's moderated t, 2004). A cell
        whose few runs agree by chance then keeps the width its neighbours show; being a hull,
        the pooled interval is never narrower for it. Three runs in a row on this machine had
        cells agreeing to 0.1% whose next run moved 5-10%.

    One run (k = 1) is that run's own estimate. The pooled ``confidence`` is the prediction's;
    ``rounds`` counts the rounds of every run (so the verdict rule of ``Estimate`` holds).
    """
    from scipy import stats

    if not runs:
        raise ValueError("pooling needs at least one run")
    if len(runs) == 1:
        return runs[0]
    logs = [math.log(run.value) for run in runs]
    k = len(logs)
    centre = statistics.fmean(logs)
    variance = statistics.variance(logs)
    level = 0.5 + confidence / 2.0  # Student's t quantile of a two-sided interval
    new_run = math.sqrt(1.0 + 1.0 / k)  # one more run's own spread, beside the mean's

    def half_width(var: float, df: float) -> float:
        return float(stats.t.ppf(level, df)) * math.sqrt(var) * new_run

    half = half_width(variance, k - 1)
    if prior is not None:
        df = prior.df + k - 1
        half = max(half, half_width((prior.df * prior.sd**2 + (k - 1) * variance) / df, df))
    return Estimate(
        value=statistics.median(run.value for run in runs),
        low=min(math.exp(centre - half), *(run.low for run in runs)),
        high=max(math.exp(centre + half), *(run.high for run in runs)),
        rounds=sum(run.rounds for run in runs),
        confidence=confidence,
        runs=k,
    )
