"""What scores a (query, title) pair, below evaluation and retrieval: BM25 (lexical, bm25), the
embedders (neural: the two towers, MiniLM, doc2vec), fusion (hybrid: re-ranking weights; fusion:
retrieval), the catalogue retriever over a `dssm index` directory, the protocol's metrics
(protocol, quality), and the MLflow pyfunc models that serve them (serving)."""
