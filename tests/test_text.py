import hashlib

from core.text import is_test_query, letter_trigrams, norm, word_trigrams


def test_trigrams_of_good_follow_the_paper():
    assert word_trigrams("good") == ["#go", "goo", "ood", "od#"]


def test_short_words_and_numbers_get_boundary_trigrams():
    assert word_trigrams("a") == ["#a#"]
    assert word_trigrams("2x4") == ["#2x", "2x4", "x4#"]
    assert letter_trigrams("  Deck   SCREWS ") == [
        ["#de", "dec", "eck", "ck#"],
        ["#sc", "scr", "cre", "rew", "ews", "ws#"],
    ]


def test_norm_lowercases_and_collapses_unicode_whitespace():
    assert norm("  Angle\u00a0 BRACKET\u3000\t3-1/2 in. ") == "angle bracket 3-1/2 in."
    assert norm("   ") == ""


def test_query_split_is_protocol_md5_rule():
    for query in ["angle bracket", "Deck  Over", "l bracket", "rain shower head", "x"]:
        expected = int(hashlib.md5(" ".join(query.lower().split()).encode()).hexdigest(), 16) % 5 == 0
        assert is_test_query(query) is expected
