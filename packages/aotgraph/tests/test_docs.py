"""Every docstring example in ember.aotgraph runs and prints what it shows."""


def test_docstring_examples(doctests):
    assert doctests("ember.aotgraph") > 0
