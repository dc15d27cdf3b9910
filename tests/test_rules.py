"""stages/clean/rules.py's bucketing: the rules are exact only if equal ids meet in one bucket, whatever
task, batch or slice of a column hashes them (the rules themselves: tests/test_clean.py)."""

import numpy as np
import pyarrow as pa

from stages.clean.rules import bucket_of


def test_equal_strings_get_one_bucket_in_any_slice_and_buckets_are_used_evenly():
    ids = [f"0000-{i:08d}" for i in range(20_000)] + ["", "é", "u\x00x", "", "a" * 300]
    whole = bucket_of(pa.array(ids), 16)
    assert whole.min() >= 0 and whole.max() < 16
    sliced = pa.array(["pad", *ids]).slice(1)  # an array that starts past its buffers' start
    assert (bucket_of(sliced, 16) == whole).all()
    one_by_one = np.array([bucket_of(pa.array([s]), 16)[0] for s in ids[::997] + ids[-5:]])
    assert (one_by_one == np.concatenate([whole[::997], whole[-5:]])).all()
    assert whole[-5] == whole[-2]  # the two empty strings
    counts = np.bincount(whole[:20_000], minlength=16)
    assert counts.min() > 20_000 / 16 * 0.8  # sequential ids spread over all buckets
    assert bucket_of(pa.array([], pa.string()), 16).shape == (0,)
