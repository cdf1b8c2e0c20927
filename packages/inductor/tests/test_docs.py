"""Every docstring example in ember.inductor runs and prints what it shows."""


def test_docstring_examples(doctests):
    assert doctests("ember.inductor") > 0
