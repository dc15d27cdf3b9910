import zipfile

import pytest

from core.errors import DssmError
from core.judgments import JudgedSetSpec, read_judgments

SPEC = JudgedSetSpec("q", "t", "l", "utf-8")


def test_reads_csv_tsv_and_zip_in_file_order(tmp_path):
    (tmp_path / "a.csv").write_text("q,t,l\nfoo,Foo Bar,3\nfoo,Baz,1\n")
    (tmp_path / "a.tsv").write_text("q\tt\tl\nfoo\tFoo, Bar\t2.5\n")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.write(tmp_path / "a.csv", "inner.csv")
    csv_pairs = read_judgments(tmp_path / "a.csv", SPEC)
    assert [(p.row, p.query, p.title, p.label) for p in csv_pairs] == [
        (0, "foo", "Foo Bar", 3.0),
        (1, "foo", "Baz", 1.0),
    ]
    assert read_judgments(tmp_path / "a.tsv", SPEC)[0].title == "Foo, Bar"
    assert read_judgments(tmp_path / "a.zip", SPEC) == csv_pairs


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "not found"),
        ("", "empty"),
        ("q,t,l\n", "no rows"),
        ("query,title,l\nfoo,bar,1\n", "missing column(s) q, t"),
        ("q,t,l\nfoo,bar,high\n", "is not a number"),
    ],
)
def test_bad_judged_sets_get_one_clear_error(tmp_path, content, message):
    path = tmp_path / "j.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DssmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_judgments(path, SPEC)


def test_wrong_encoding_is_named(tmp_path):
    path = tmp_path / "j.csv"
    path.write_bytes("q,t,l\nfoo,caf\xe9,1\n".encode("latin-1"))
    with pytest.raises(DssmError, match="--encoding"):
        read_judgments(path, SPEC)
    assert read_judgments(path, JudgedSetSpec("q", "t", "l", "latin-1"))[0].title == "café"


def test_a_damaged_zip_is_named_as_such_not_as_a_bad_label(tmp_path):
    from core.judgments import DEFAULT_CATALOGUE

    good = tmp_path / "j.zip"
    with zipfile.ZipFile(good, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(DEFAULT_CATALOGUE, "train.csv")
    raw = bytearray(good.read_bytes())
    for i in range(2000, 2040):
        raw[i] ^= 0x55
    bad = tmp_path / "bad.zip"
    bad.write_bytes(bytes(raw))
    with pytest.raises(DssmError, match="the zip is damaged"):
        read_judgments(bad)
    assert len(read_judgments(good)) > 1000


def test_the_embedded_set_given_by_its_file_name_is_the_embedded_set(tmp_path):
    """Issue 63's probe: `dssm evaluate --judgments dssm/data/default_catalogue.csv` named it
    data-default_catalogue, so registering its models made a second registered model (and champion)
    beside the run's dssm-default-catalogue. By its file name, or as a copy, it is the same set."""
    import shutil

    from core.judgments import DEFAULT_CATALOGUE, resolve_judged_set

    run = resolve_judged_set(None, default=DEFAULT_CATALOGUE)
    by_name = resolve_judged_set(DEFAULT_CATALOGUE)
    shutil.copy(DEFAULT_CATALOGUE, tmp_path / "catalogue.csv")
    copied = resolve_judged_set(tmp_path / "catalogue.csv")
    assert run.name == by_name.name == copied.name == "default-catalogue"
    assert by_name.embedded and copied.sha256 == run.sha256
    other = tmp_path / "other" / "judged.csv"
    other.parent.mkdir()
    other.write_text("search_term,product_title,relevance\ndrill,cordless drill,3\n")
    assert resolve_judged_set(other).name == "other-judged"
