"""The sections of `dssm analyze`'s report: each returns its Markdown lines and the numbers behind
them (for analysis.json), and writes its PNGs into the report directory."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from scoring.neural import TwoTowerEmbedder
from stages.analyze.compare import read_pair
from stages.analyze.config import KeywordRule
from stages.analyze.lstm import keyword_counts, keywords, plot_internals, plot_top_cells, top_cells, trace_texts
from stages.analyze.topics import TopicTable, input_gate_by_word, keyword_rate, topic_table


def _row(label: str, values: list[Any]) -> str:
    return "| " + " | ".join([label, *(str(v).replace("|", "\\|") for v in values)]) + " |"


def word_table(words: list[str], rows: dict[str, list[Any]]) -> list[str]:
    """A Markdown table with the words as columns and one row per quantity."""
    return [_row("", words), "|---" * (len(words) + 1) + "|", *(_row(k, v) for k, v in rows.items())]


def pair_section(
    n: int, query: str, title: str, models: list[TwoTowerEmbedder], rule: KeywordRule, out: Path
) -> tuple[list[str], dict[str, Any]]:
    """Figs. 4-6 and Tables I-II of the first model on one pair; with more models, Tables V-VIII."""
    first = models[0]
    md = [f"## Pair {n}: query “{query}”, title “{title}”", ""]
    numbers: dict[str, Any] = {"query": query, "title": title}
    for side, text, tower in (("query", query, "query"), ("title", title, "doc")):
        trace = trace_texts(first.model, first.tokenizer, [text], tower)[0]
        cells = top_cells(trace, rule.top)
        rows: dict[str, list[Any]] = {"cells moved": keyword_counts(trace, cells, rule.threshold).tolist()}
        if trace.bidirectional:
            back = top_cells(trace, rule.top, "bw_y")
            rows["cells moved (backward)"] = keyword_counts(trace, back, rule.threshold, "bw_y").tolist()
        if "i" in trace.series:
            rows["mean input gate"] = [round(float(v), 3) for v in trace.series["i"].mean(axis=1)]
        found = keywords(trace, rule)
        stem = f"pair{n}-{side}"
        plot_internals(trace, out / f"{stem}-internals.png")
        plot_top_cells(trace, cells, out / f"{stem}-top-cells.png")
        md += [f"### {side.capitalize()} ({tower} tower): keywords {', '.join(found) or '–'}", ""]
        md += [*word_table(trace.words, rows), "", f"![{side} internals]({stem}-internals.png)"]
        md += [f"![{side} most active cells]({stem}-top-cells.png)", ""]
        numbers[side] = {"words": trace.words, "keywords": found} | {k.replace(" ", "_"): v for k, v in rows.items()}
    if len(models) > 1:
        readings = [read_pair(m, query, title, rule) for m in models]
        md += ["### Models side by side (Tables V-VIII)", "", _row("model", ["cosine(query, title)"]), "|---|---|"]
        md += [_row(r.model, [f"{r.score:.4f}"]) for r in readings]
        md += ["", "Cells moved per word, of each model's own most active cells:", ""]
        md += word_table(readings[0].query_words, {r.model: r.query_counts for r in readings}) + [""]
        md += word_table(readings[0].title_words, {r.model: r.title_counts for r in readings}) + [""]
        numbers["comparison"] = [asdict(r) for r in readings]
    return md, numbers


def test_section(
    queries: list[tuple[str, str]], models: list[TwoTowerEmbedder], rule: KeywordRule, topic_cells: int, shown: int
) -> tuple[list[str], dict[str, Any]]:
    """Over the test queries (and their best titles): keywords per model and tower, the words the
    first model's input gates attenuate, and its topic allocation (Table III)."""
    first = models[0]
    traces = trace_texts(first.model, first.tokenizer, [q for q, _ in queries], "query")
    md = [f"## The {len(queries):,} test queries", ""]
    md += ["Keywords over the test queries and their best-graded titles:", ""]
    md += ["| model | tower | words that are keywords | most frequent keywords |", "|---|---|---|---|"]
    numbers: dict[str, Any] = {"queries": len(queries), "keywords": []}
    for model in models:
        for tower, texts in (("query", [q for q, _ in queries]), ("doc", [t for _, t in queries])):
            found_traces = (
                traces
                if model is first and tower == "query"
                else trace_texts(model.model, model.tokenizer, texts, tower)
            )
            rate, found = keyword_rate(found_traces, rule)
            top = ", ".join(f"{w} ({c})" for w, c in found.most_common(10))
            md.append(_row(model.encoder_name, [tower, f"{rate:.1%}", top]))
            numbers["keywords"].append(
                {"model": model.encoder_name, "tower": tower, "rate": rate, "most_frequent": found.most_common(30)}
            )
    gates = input_gate_by_word(traces)
    if gates:
        low, high = gates[:12], gates[::-1][:12]
        md += ["", f"Mean input gate i(t) of `{first.encoder_name}`'s query tower per word (words read ≥ 5 times): "]
        md[-1] += "the lowest are the words it attenuates, the highest the words it lets in."
        md += ["", "| attenuated | i(t) | n | let in | i(t) | n |", "|---|---|---|---|---|---|"]
        md += [
            f"| {a[0]} | {a[1]:.3f} | {a[2]} | {b[0]} | {b[1]:.3f} | {b[2]} |" for a, b in zip(low, high, strict=True)
        ]
        numbers["input_gate_lowest"], numbers["input_gate_highest"] = low, high
    table = topic_table(traces, rule, topic_cells, shown)
    md += ["", *topic_markdown(table)]
    numbers["topics"] = asdict(table)
    return md, numbers


def topic_markdown(table: TopicTable) -> list[str]:
    md = [f"### Topic allocation (Table III): keywords picked up by the {len(table.cells)} most active cells", ""]
    md += [_row("cell", table.queries), "|---" * (len(table.queries) + 1) + "|"]
    md += [_row(str(c), [", ".join(e) or "–" for e in row]) for c, row in zip(table.cells, table.entries, strict=True)]
    md += ["", f"Over all {table.n_queries:,} queries, the keywords each cell picks up most often:", ""]
    for cell, topic in zip(table.cells, table.topics, strict=True):
        md.append(f"- cell {cell}: " + (", ".join(f"{w} ({n})" for w, n in topic) or "none"))
    return md + [""]


def probe_section(texts: list[str], probes: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Appendix F: doc2vec trained as the baseline is (on every query and title), and its nearest
    words to each probe word."""
    from scoring.neural import Doc2VecEmbedder

    wv = Doc2VecEmbedder(texts).model.wv
    md = ["## doc2vec sanity check (appendix F): nearest words", "", "| probe | nearest words (cosine) |", "|---|---|"]
    found = {}
    for word in probes:
        near = wv.most_similar(word, topn=8) if word in wv.key_to_index else []
        found[word] = [(w, round(float(s), 3)) for w, s in near]
        md.append(_row(word, [", ".join(f"{w} ({s:.2f})" for w, s in near) or "not in the vocabulary"]))
    return md + [""], found
