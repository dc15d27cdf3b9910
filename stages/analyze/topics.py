"""The LSTM-RNN over a whole query set (Palangi et al. 2016, section V-A, Table III): which cells are
most active, which keywords each of them picks up, and which words the input gates attenuate.

Everything here is a function of Traces (stages/analyze/lstm.py), so a test can set the arrays.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from stages.analyze.config import KeywordRule
from stages.analyze.lstm import Trace, keywords, moved_cells, top_cells


@dataclass
class TopicTable:
    """Table III: `cells` (most active first) × `queries`; entries[c][q] are the keywords of query q
    whose reading moves cell c by more than the threshold. `topics[c]`: the words cell c picks up
    most often over every query analysed, with their counts."""

    cells: list[int]
    queries: list[str]
    entries: list[list[list[str]]]
    topics: list[list[tuple[str, int]]]
    n_queries: int


def most_active_cells(traces: list[Trace], k: int = 5, top: int = 10) -> np.ndarray:
    """The k cells most often among a query's `top` most active cells; ties go to the larger mean
    final output."""
    cells = traces[0].series["y"].shape[1]
    times = np.zeros(cells)
    activation = np.zeros(cells)
    for trace in traces:
        times[top_cells(trace, top)] += 1
        activation += trace.series["y"][-1]
    return np.lexsort((-activation, -times))[:k]


def cell_keywords(trace: Trace, cells: np.ndarray, rule: KeywordRule) -> list[list[str]]:
    """Per cell in `cells`: the trace's keywords that move that cell when read."""
    chosen = set(keywords(trace, rule))
    moved = moved_cells(trace, cells, rule.threshold)
    return [[w for w, m in zip(trace.words, moved[:, j], strict=True) if m and w in chosen] for j in range(len(cells))]


def topic_table(traces: list[Trace], rule: KeywordRule, k: int = 5, shown: int = 8, per_cell: int = 8) -> TopicTable:
    """Table III over `traces` (the test queries): the k most active cells, the keywords each picks
    up per query, shown for the `shown` queries where those cells pick up the most."""
    cells = most_active_cells(traces, k, rule.top)
    per_query = [cell_keywords(t, cells, rule) for t in traces]
    counters = [Counter(w for entry in per_query for w in entry[j]) for j in range(len(cells))]
    # Queries whose cells pick up the most, then the most distinct words; ties keep the input order.
    richness = [
        (-sum(len(e) > 0 for e in entry), -len({w for e in entry for w in e}), i) for i, entry in enumerate(per_query)
    ]
    columns = [i for _, _, i in sorted(richness)[:shown]]
    return TopicTable(
        cells=[int(c) for c in cells],
        queries=[traces[i].text for i in columns],
        entries=[[per_query[i][j] for i in columns] for j in range(len(cells))],
        topics=[c.most_common(per_cell) for c in counters],
        n_queries=len(traces),
    )


def input_gate_by_word(traces: list[Trace], min_count: int = 5) -> list[tuple[str, float, int]]:
    """Each word's mean input gate i(t) (over the cells and its occurrences), for words read at
    least `min_count` times, lowest first: the words the LSTM-RNN attenuates lead the list."""
    totals: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for trace in traces:
        if "i" not in trace.series:
            continue
        for word, gate in zip(trace.words, trace.series["i"].mean(axis=1), strict=True):
            totals[word] = totals.get(word, 0.0) + float(gate)
            counts[word] += 1
    rows = [(w, totals[w] / n, n) for w, n in counts.items() if n >= min_count]
    return sorted(rows, key=lambda r: (r[1], r[0]))


def keyword_rate(traces: list[Trace], rule: KeywordRule) -> tuple[float, Counter[str]]:
    """The share of words read that are keywords, and how often each word is one."""
    found: Counter[str] = Counter()
    words = 0
    for trace in traces:
        found.update(keywords(trace, rule))
        words += len(trace.words)
    return (sum(found.values()) / words if words else 0.0), found
