"""The Parquet contracts between stages, as pyarrow schemas (docs/architecture.md lists them).

Spark jobs cast their outputs to the Spark form of these schemas before writing, and check the
files they wrote against them, so a downstream reader (the trainer streams with pyarrow) can rely
on exact column names, types and nullability.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import DssmError

_str_list = pa.list_(pa.field("element", pa.string(), nullable=False))
_float_list = pa.list_(pa.field("element", pa.float64(), nullable=False))

TEST_PAIRS = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),  # position in the judged file (stable tie order)
        pa.field("query", pa.string(), nullable=False),
        pa.field("query_norm", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("label", pa.float64(), nullable=False),
    ]
)

CLICK_PAIRS = pa.schema(
    [
        pa.field("query", pa.string(), nullable=False),  # normalised (PROTOCOL.md §2)
        pa.field("title", pa.string(), nullable=False),  # normalised
        pa.field("clicks", pa.int64(), nullable=False),
        pa.field("impressions", pa.int64(), nullable=False),  # times the title was shown for the query
    ]
)

TITLES = pa.schema(
    [
        pa.field("title", pa.string(), nullable=False),
        pa.field("impressions", pa.int64(), nullable=False),
        pa.field("clicks", pa.int64(), nullable=False),
    ]
)

REJECTS = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),  # file the line came from
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=True),
        pa.field("raw", pa.string(), nullable=True),  # the line itself, for malformed lines
        pa.field("impression_id", pa.string(), nullable=True),
        pa.field("user_id", pa.string(), nullable=True),
    ]
)

IMPRESSIONS = pa.schema(
    [
        pa.field("impression_id", pa.string(), nullable=False),
        pa.field("ts_ms", pa.int64(), nullable=False),
        pa.field("query", pa.string(), nullable=False),  # normalised
        pa.field("titles", _str_list, nullable=False),  # shown, in rank order, normalised
        pa.field("positions", pa.list_(pa.field("element", pa.int32(), nullable=False)), nullable=False),  # ranks
        pa.field("clicked", pa.list_(pa.field("element", pa.bool_(), nullable=False)), nullable=False),
        pa.field("dwell_ms", pa.list_(pa.field("element", pa.int32(), nullable=False)), nullable=False),  # 0: no click
    ]
)

VOCAB = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),  # 0 is reserved for unknown
        pa.field("token", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
    ]
)

NEGATIVES = pa.schema(
    [
        pa.field("query", pa.string(), nullable=False),
        pa.field("positive", pa.string(), nullable=False),
        pa.field("negatives", _str_list, nullable=False),
        pa.field("clicks", pa.int64(), nullable=False),
        pa.field("impressions", pa.int64(), nullable=False),
        # Σ 1/θ(rank) over the pair's clicks (θ: examination at the click's rank; = clicks without `debias`)
        pa.field("debiased_clicks", pa.float64(), nullable=False),
        # On one row per query (its first positive), with `list_size` > 0: the titles shown for the
        # query, most examined first, and each one's clicks over its expected examinations Σ θ(rank)
        # (`list_targets=map`: its attractiveness under the position-based model)
        pa.field("shown", _str_list, nullable=False),
        pa.field("relevance", _float_list, nullable=False),
    ]
)

CATALOGUE = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),  # as the catalogue writes it (clean normalises)
    ]
)

EMBEDDINGS = pa.schema(
    [
        pa.field("title", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(pa.field("element", pa.float32(), nullable=False)), nullable=False),
        pa.field("model_version", pa.string(), nullable=False),  # NAME/VERSION of the registered model
    ]
)

CATALOGUE_FILE = "catalogue.parquet"  # a v2 simulated log's side table, beside its logs/ (simulate writes, clean reads)


def embeddings_schema(partners: list[int]) -> pa.Schema:
    """EMBEDDINGS plus `embedding_I` for each dense partner of a hybrid (its position I among the components)."""
    vector = EMBEDDINGS.field("embedding").type
    return pa.schema([*EMBEDDINGS, *(pa.field(f"embedding_{i}", vector, nullable=False) for i in partners)])


def spark_schema(schema: pa.Schema):  # -> pyspark.sql.types.StructType
    """The Spark StructType with the same names, types and nullability."""
    from pyspark.sql import types as T

    def convert(dtype: pa.DataType):
        if pa.types.is_string(dtype):
            return T.StringType()
        if pa.types.is_int64(dtype):
            return T.LongType()
        if pa.types.is_int32(dtype):
            return T.IntegerType()
        if pa.types.is_float64(dtype):
            return T.DoubleType()
        if pa.types.is_float32(dtype):
            return T.FloatType()
        if pa.types.is_boolean(dtype):
            return T.BooleanType()
        if pa.types.is_list(dtype):
            return T.ArrayType(convert(dtype.value_type), containsNull=True)  # Spark cannot cast to False
        raise TypeError(f"no Spark type for {dtype}")

    return T.StructType([T.StructField(f.name, convert(f.type), f.nullable) for f in schema])


def _relaxed(schema: pa.Schema) -> pa.Schema:
    """`schema` with every field nullable: Spark writes nullable columns whatever it knows."""

    def relax(dtype: pa.DataType) -> pa.DataType:
        if pa.types.is_list(dtype):
            return pa.list_(pa.field("element", relax(dtype.value_type)))
        return dtype

    return pa.schema([pa.field(f.name, relax(f.type)) for f in schema])


def check_parquet(path: Path, schema: pa.Schema) -> None:
    """Raise unless every Parquet file under `path` has `schema`'s names and types and no null
    in a column the contract declares non-nullable (checked from the row-group statistics)."""
    files = sorted(Path(path).glob("*.parquet")) if Path(path).is_dir() else [Path(path)]
    required = {i for i, f in enumerate(schema) if not f.nullable and not pa.types.is_list(f.type)}
    for file in files:
        meta = pq.ParquetFile(file)
        found = meta.schema_arrow.remove_metadata()
        if not _relaxed(found).equals(_relaxed(schema)):
            raise DssmError(f"{file}: schema {found} differs from the contract {schema}")
        for rg in range(meta.metadata.num_row_groups):
            group = meta.metadata.row_group(rg)
            for col in range(group.num_columns):
                column = group.column(col)
                stats = column.statistics
                name = column.path_in_schema
                if name in {schema[i].name for i in required} and stats is not None and stats.null_count:
                    raise DssmError(f"{file}: column {name} has {stats.null_count} nulls; the contract forbids them")


def title_pool(path: Path) -> Path:
    """The clean stage's title pool at `path`: its `titles/` folder, given as such or as the clean output
    that holds it."""
    path = Path(path)
    return path / "titles" if (path / "titles").is_dir() and not any(path.glob("*.parquet")) else path


def read_title_pool(path: Path) -> list[str]:
    """The `title` column of a title pool (a clean output or its `titles/`), or a clear error naming `path`."""
    pool = title_pool(path)
    if not pool.exists():
        raise DssmError(f"{path}: not found (give a `dssm clean` output or its titles/)")
    try:
        return pq.read_table(pool, columns=["title"]).column("title").to_pylist()
    except (OSError, pa.ArrowException, KeyError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DssmError(f"{path}: not a title pool ({reason}); give a `dssm clean` output or its titles/") from None
