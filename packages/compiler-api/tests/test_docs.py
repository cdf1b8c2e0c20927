"""Every docstring example in ember.compiler runs and prints what it shows."""


def test_docstring_examples(doctests):
    assert doctests("ember.compiler") > 0
