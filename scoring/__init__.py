"""What scores a (query, title) pair and what the stages share to compare systems, below the stages:
BM25 (lexical, bm25), the embedders (neural: the two towers, MiniLM, doc2vec), fusion (hybrid:
re-ranking weights; fusion: retrieval), the catalogue retriever over a `dssm index` directory, the
protocol's metrics (protocol, quality), the systems an evaluation compares (systems, baselines),
full-catalogue retrieval (catalogue), the files evaluate hands register and gate (handoff), and the
MLflow pyfunc models that serve them (serving)."""
